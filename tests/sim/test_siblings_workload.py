"""`grpo-siblings` (issue 39, item 5): code-rl's answers in GRPO groups that name their
siblings, one prompt's tests per group and per-test times correlated within it; the trace
format carries the group; the simulated core learns from a group's finished answers."""

from __future__ import annotations

import math
import statistics

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.sim.runner import make_core, run_policy
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import SimAction, SpecError, parse_trajectory, trajectory_json
from arl_tangram.sim.workloads import SIBLINGS_RHO, SiblingCode, get_workload, without_siblings


def test_groups_share_a_prompt_and_name_it() -> None:
    batch = next(iter(get_workload("grpo-siblings").batches(0, 40, 1)))
    assert [t.siblings for t in batch[::8]] == ["s0-g0", "s0-g0", "s0-g1", "s0-g1", "s0-g2"]
    for g in range(3):
        members = batch[16 * g:16 * g + 16]
        assert len({t.steps[0][1].hints.test_count for t in members}) == 1
    a = batch[0].steps[0][1]
    assert (a.kind, a.tag, a.hints.test_count, a.timeout_s) == (ActionKind.TEST, "python", 25, 150.0)
    assert a.work_s == pytest.approx(1.8152289022, rel=1e-9)
    assert batch[0].id == "s0-sib-0" and batch[0].task == "code-rl"
    assert [t.siblings for t in without_siblings(batch[:2])] == [None, None]


def test_the_correlation_within_a_group_is_the_documented_one() -> None:
    maker = SiblingCode(size=2)
    import random
    rng = random.Random(7)
    pairs = []
    for i in range(0, 8000, 2):
        a, b = maker(rng, 0, i), maker(rng, 0, i + 1)
        pairs.append(tuple(math.log(t.steps[0][1].work_s / t.steps[0][1].hints.test_count)
                           for t in (a, b)))
    r = statistics.correlation([p[0] for p in pairs], [p[1] for p in pairs])
    assert SIBLINGS_RHO == 0.5 and r == pytest.approx(0.5, abs=0.05)


def test_the_trace_carries_the_group() -> None:
    t = parse_trajectory({"id": "t", "siblings": "p1", "steps": [[1.0, {"kind": "test", "work_s": 2}]]})
    assert t.siblings == "p1"
    assert trajectory_json(t)["siblings"] == "p1"
    assert "siblings" not in trajectory_json(parse_trajectory({"id": "u", "steps": [[1.0, {"kind": "test", "work_s": 2}]]}))
    with pytest.raises(SpecError, match="siblings"):
        parse_trajectory({"id": "t", "siblings": "", "steps": [[1.0, {"kind": "test", "work_s": 2}]]})
    spec = SimAction(ActionKind.TEST, 1.0).spec("a", task="x", trajectory="t", session_id=None,
                                               siblings="p1")
    assert spec.siblings == "p1" and spec.tenant is None


def test_the_simulated_core_learns_from_siblings() -> None:
    w = get_workload("grpo-siblings")
    made: list = []

    def factory(*a, **kw):
        made.append(make_core(*a, **kw))
        return made[-1]

    r = run_policy(w.cluster(32), lambda: w.batches(0, 32, 1), "tangram", seed=0,
                   config=SimConfig(train_s=w.train_s), core_factory=factory)
    assert r.act["count"] == 32
    est = made[0].st.estimator
    from arl_tangram.core.estimator import DurationEstimator
    key, _ = DurationEstimator.work_of(
        SimAction(ActionKind.TEST, 1.0, hints=next(iter(w.batches(0, 32, 1)))[0].steps[0][1].hints,
                  tag="python").spec("x", task="code-rl", trajectory="t", session_id=None,
                                     siblings="s0-g0"))
    n, _ = est.sibling_stats(key)
    assert n == 16


class _Rng:
    """Every normal draw the same: the clamps of tests and per-test time are reached."""

    def __init__(self, z: float) -> None:
        self.z = z

    def gauss(self, _mu: float, _sigma: float) -> float:
        return self.z


def test_the_draws_are_clamped_as_code_rls() -> None:
    far = SiblingCode()(_Rng(5.0), 2, 32)  # 12 e^4 tests -> 200; 0.15 e^(5 sqrt 2) s -> 6 s
    a = far.steps[0][1]
    assert (far.siblings, a.hints.test_count, a.work_s, a.timeout_s) == ("s2-g2", 200, 1200.0, 1200.0)
    near = SiblingCode()(_Rng(-5.0), 0, 3)  # 12 e^-4 tests -> 1; per-test -> 0.02 s
    b = near.steps[0][1]
    assert (near.siblings, b.hints.test_count, b.work_s, b.timeout_s) == ("s0-g0", 1, 0.02, 60.0)
    assert near.steps[0][0] == pytest.approx(5000 * math.exp(-2.5) / 40.0, rel=1e-12)  # as code-rl
