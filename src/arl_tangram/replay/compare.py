"""Every policy of a comparison on the same trace, one after another, on real resources.

Invariant: each policy runs on a fresh engine (`driver.replay_policy`), in the order given,
after this process's one-time costs were paid (`driver.warm_process`), so that none of them is
charged to the first policy; the policies compared are `tangram simulate --compare`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.cluster import ClusterSpec
from ..sim.trace import Trajectory
from .driver import Progress, ReplayReport, replay_policy, warm_process

# called as each policy's run begins, with its label and its number of actions; returns that
# run's progress callback (or None)
StartRun = Callable[[str, int], Progress | None]


def policy_labels(cluster: ClusterSpec) -> list[str]:
    """`tangram simulate --compare`'s runs, less static-pool allotments no node could give
    (they are static-pool:max's run again)."""
    from ..core.resources import CPU
    from ..sim import runner

    biggest = max(n.capacity.get(CPU) for n in cluster.nodes)
    out = []
    for label in runner.policies():
        parse = getattr(runner, "parse_policy", None)
        if parse is not None:
            _name, fixed = parse(label)
            k = fixed.get("static_k")
            if k is not None and k > biggest:
                continue
        out.append(label)
    return out


def replay_all(cluster: ClusterSpec, steps: Sequence[Sequence[Trajectory]], labels: Sequence[str],
               *, trace: str, units_per_s: float, train_s: float, url: str | None,
               start_run: StartRun | None = None,
               on_done: Callable[[ReplayReport], None] | None = None,
               images: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One report per policy (keyed by the policy that ran: a service's own at ``url``)."""
    warm_process(cluster)
    total = sum(len(t.steps) for b in steps for t in b)
    reports: dict[str, Any] = {}
    for label in labels:
        tick = start_run(label, total) if start_run is not None else None
        rep = asyncio.run(replay_policy(cluster, steps, label, trace=trace,
                                        units_per_s=units_per_s, train_s=train_s, url=url,
                                        progress=tick, images=images))
        reports[rep.policy] = rep
        if on_done is not None:
            on_done(rep)
    return reports
