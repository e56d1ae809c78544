"""The work program: real CPU work of a replayed action, run inside its sandbox.

Invariant: the program burns ``units`` units of pure-Python arithmetic (one unit is `UNIT_ITERS`
loop iterations; `tangram calibrate` measures how many units one core does per second, so a
trace's ``work_s`` becomes ``work_s x units_per_s`` units). The serial part (``1 - p`` of the
units) runs in the program's own process; the parallel part is split evenly over ``workers``
forked processes (not threads: the GIL would serialize them). The sandbox's cgroup CPU quota, set
from the action's allotment (and changed by a resize), is what bounds the speed: on a 0.25-core
quota the serial part runs 4x slower than on one core; on two cores the parallel part runs on
both. ``workers`` is the most cores the action can ever use (its elasticity's maximum, at most
the machine's cores), which is also what the sandbox shows an elastic action as
``os.cpu_count()`` from its start (docs/sandbox.md, "Cores"), so all of them are forked and a
resize mid-run is felt at once without respawning anything.
"""

from __future__ import annotations

import math

UNIT_ITERS = 2000  # loop iterations per unit (~0.1 ms of one core on a recent x86 core)

_TEMPLATE = """\
import os
def _burn(n):
    x = 1
    for _ in range(n):
        for i in range({iters}):
            x = (x * 1103515245 + i) & 0xFFFFFFFF
    return x
_units, _p, _w = {units}, {p!r}, {workers}
_par = int(round(_units * _p)) if _w > 1 else 0
_burn(_units - _par)
if _par:
    _w = max(1, min(_w, os.cpu_count() or 1))
    _kids = []
    for _k in range(_w):
        _n = _par // _w + (1 if _k < _par % _w else 0)
        _pid = os.fork()
        if _pid == 0:
            try:
                _burn(_n)
            finally:
                os._exit(0)
        _kids.append(_pid)
    for _pid in _kids:
        os.waitpid(_pid, 0)
{tail}"""

_SESSION_TAIL = """\
globals()["_tangram_turns"] = globals().get("_tangram_turns", 0) + 1
print("turn", _tangram_turns)
"""


def units_for(work_s: float, units_per_s: float) -> int:
    """Units of work that take ``work_s`` seconds of one core at ``units_per_s``."""
    return max(0, round(work_s * units_per_s))


def workers_for(elastic_max: float | None, parallel_fraction: float) -> int:
    """Processes for the parallel part: the most cores the action could ever be given."""
    if elastic_max is None or parallel_fraction <= 0 or elastic_max <= 1:
        return 1
    return max(1, math.ceil(elastic_max - 1e-9))


def program(units: int, parallel_fraction: float = 0.0, workers: int = 1, *,
            session: bool = False) -> str:
    """Python source of the work program. ``session``: also bump a counter kept in the session's
    interpreter and print it (``turn N``), which shows the state persisting between actions."""
    return _TEMPLATE.format(iters=UNIT_ITERS, units=int(units), p=float(parallel_fraction),
                            workers=int(workers), tail=_SESSION_TAIL if session else "")
