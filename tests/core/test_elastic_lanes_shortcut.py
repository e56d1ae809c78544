"""`Elastic.plan`'s shortcut (`_lanes_all_at_max`) decides what the exact rule (`_best_lanes`,
a fluid model per lane count) decides, wherever it answers: issue 24 (a session's elastic test
on a node with room for every elastic job at its maximum costs no fluid model), decisions
unchanged."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.core import FORM
from arl_tangram.core.actions import Elasticity, Speedup
from arl_tangram.core.elastic import _best_lanes, _lane_tries, _lanes_all_at_max

ELS = [Elasticity(1, 4, speedup=Speedup(0.6)), Elasticity(1, 8, speedup=Speedup(0.7)),
       Elasticity(0.5, 2, speedup=Speedup(0.9)), Elasticity(2, 16, speedup=Speedup(0.95))]

job = st.tuples(st.floats(0.0, 500.0), st.sampled_from(ELS))


@settings(max_examples=400, deadline=None)
@given(cap=st.sampled_from([4.0, 8.0, 16.0, 48.0, 192.0]), runs=st.lists(job, max_size=24),
       x=st.floats(0.0, 300.0), el=st.sampled_from(ELS))
def test_the_shortcut_answers_what_the_fluid_model_answers(cap, runs, x, el):
    top = min(el.max, cap)
    if top < el.min - 1e-9:
        return
    got = _lanes_all_at_max(cap, top, el.min, runs, x, el)
    if got < 0:
        return  # not sure: plan asks the exact rule
    want = _best_lanes(cap, top, el.min, sorted(runs, key=lambda j: j[0]), x, el, 0, math.inf, None, 0.0)
    assert got == want


def test_room_for_everyone_starts_now_at_the_first_count_above_the_running():
    el = ELS[0]  # 1..4 cores
    runs = [(30.0, el), (5.0, el), (60.0, el)]  # 12 cores at their maximum, 192 there
    got = _lanes_all_at_max(192.0, 4.0, 1.0, runs, 10.0, el)
    assert got == 4 == min(n for n in _lane_tries(192.0, 4.0, 1.0, 3) if n > 3)
    assert got == _best_lanes(192.0, 4.0, 1.0, sorted(runs, key=lambda j: j[0]), 10.0, el, 0, math.inf,
                              None, 0.0)


def test_no_shortcut_without_room_or_with_a_run_about_to_end():
    el = ELS[0]
    # 3 x 4 + 4 = 16 > 12 cores: someone is below its maximum, the fluid model decides
    assert _lanes_all_at_max(12.0, 4.0, 1.0, [(30.0, el)] * 3, 10.0, el) == -1
    # a running job with nothing left: waiting costs (almost) nothing more, too close to call
    assert _lanes_all_at_max(192.0, 4.0, 1.0, [(0.0, el), (30.0, el)], 10.0, el) == -1
    assert _lanes_all_at_max(192.0, 4.0, 1.0, [(1e-12, el), (30.0, el)], 10.0, el) == -1
    # nothing running: the first count tried (no waiting to weigh)
    assert _lanes_all_at_max(192.0, 4.0, 1.0, [], 10.0, el) == _lane_tries(192.0, 4.0, 1.0, 0)[0]


def _fluid_calls(fn) -> int:
    """Calls of the fluid model's functions (`_fluid*`) while ``fn`` runs, as a profile hook
    sees them: the pure core's (the compiled one's calls are not Python frames: 0)."""
    import sys

    count = [0]

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name.startswith("_fluid"):
            count[0] += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def test_a_full_node_weighs_only_waiting_and_prices_nothing():
    """No lane count above the running ones fits (each runs at least its minimum, 1 core, and
    the node's elastic capacity holds no more than those running): the answer is to wait, as
    many lanes as run, without a fluid model (issue 40: on a crowded node a quarter of the
    plans were such)."""
    el = ELS[0]  # 1..4 cores
    runs = sorted([(30.0 + i, el) for i in range(12)], key=lambda j: j[0])
    assert _lane_tries(12.0, 4.0, 1.0, 12) == [12]
    got: list[int] = []
    assert _fluid_calls(lambda: got.append(_best_lanes(12.0, 4.0, 1.0, runs, 10.0, el, 2, math.inf,
                                                       None, 0.0))) == 0
    assert got == [12]
    # no capacity at all (a fluid model there never ends: it priced waiting at infinity, 0)
    assert _best_lanes(0.0, 4.0, 1.0, runs, 10.0, el, 0, math.inf, None, 0.0) == 12
    assert _best_lanes(0.0, 4.0, 1.0, [], 10.0, el, 0, math.inf, None, 0.0) == 0
    # one core more: one lane more is weighed (the fluid model runs, where pure)
    assert _lane_tries(13.0, 4.0, 1.0, 12) == [12, 13]
    more = _fluid_calls(lambda: _best_lanes(13.0, 4.0, 1.0, runs, 10.0, el, 0, math.inf, None, 0.0))
    assert _best_lanes(13.0, 4.0, 1.0, runs, 10.0, el, 0, math.inf, None, 0.0) == 13
    # (`_fluid_on` and `_fluid_one` per count, as the pure core's hook sees them: not vacuous)
    assert more == (4 if FORM.startswith("pure") else 0)
