"""The core's speed-ups decide exactly what the plain code they replace decides.

- `build.fast_constructor` objects equal (and behave as) the dataclasses built normally;
- the one-node pass `SchedulingPass.fill_node` gives the same commands as the general pass `run_pass` it
  shortcuts, on random runs with aging, warm pools and elastic actions (command streams are
  compared whole, so any difference in order, node, allotment or cause fails);
- `DurationEstimator.predict_work` / `observe_work` give `predict` / `observe`'s numbers.
"""

from __future__ import annotations

import math
import random

import pytest

from arl_tangram.core import Core, CoreConfig, build
from arl_tangram.core.actions import (
    ActionKind,
    ActionResult,
    ActionSpec,
    Elasticity,
    Speedup,
    Status,
    WorkHints,
)
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.commands import Deliver, StartAction
from arl_tangram.core.estimator import PRIORS, DurationEstimator, basis_of
from arl_tangram.core.events import (
    ActionArrived,
    ActionFinished,
    ActionStarted,
    Tick,
    WarmPoolReport,
)
from arl_tangram.core.resources import CPU, Resources
from arl_tangram.core.scheduling import SchedulingPass


def test_fast_constructors_equal_the_dataclasses() -> None:
    spec = ActionSpec("a", demand=Resources(cpu=2, memory_mb=64))
    alloc = Resources(cpu=2, memory_mb=64)
    cases = [
        (build.make_start(spec, "n0", alloc, False, "c"), StartAction(spec, "n0", alloc, False, cause="c")),
        (build.make_result("a", Status.FAILED, 1.0, 2.0, 3.0, "n0", alloc, {"x": 1}, "why", 2),
         ActionResult("a", Status.FAILED, 1.0, 2.0, 3.0, node="n0", allotment=alloc, output={"x": 1},
                      reason="why", attempts=2)),
        (build.make_arrived(1.5, spec), ActionArrived(1.5, spec)),
        (build.make_started(1.5, "a", "n0", 0.25), ActionStarted(1.5, "a", "n0", cold_start_s=0.25)),
        (build.make_finished(2.0, "a", Status.SUCCEEDED, None, "", 0.5),
         ActionFinished(2.0, "a", run_s=0.5)),
    ]
    res = cases[1][0]
    cases.append((build.make_deliver(res, "c"), Deliver(res, cause="c")))
    for fast, plain in cases:
        assert type(fast) is type(plain)
        assert fast == plain and repr(fast) == repr(plain)
        errors = []
        for obj in (fast, plain):  # frozen alike (whatever a frozen slotted dataclass raises)
            with pytest.raises(Exception) as info:
                obj.cause = "x"  # type: ignore[misc, union-attr]
            errors.append(type(info.value))
        assert errors[0] is errors[1]


def test_fast_spec_runs_post_init() -> None:
    el = Elasticity(2, 8, speedup=Speedup(0.5))
    args = ("t", ActionKind.TEST, Resources(cpu=1, memory_mb=5), el, WorkHints(test_count=3), "task",
            "traj", None, None, "py", 30.0, 1.0, True, {})
    fast = build.make_spec(*args)
    assert fast == ActionSpec(*args) and fast.demand.get(CPU) == 2.0  # post-init moved cpu to min
    with pytest.raises(ValueError, match="weight"):
        build.make_spec("t", ActionKind.CODE, Resources(cpu=1), None, WorkHints(), "task", None, None,
                        None, None, 30.0, 0.0, True, {})


def test_fast_constructor_refuses_what_it_cannot_build() -> None:
    class Plain:
        pass

    with pytest.raises(TypeError):
        build.fast_constructor(Plain)


def _run(seed: int, policy: str, fill: bool) -> list[str]:
    """A random closed loop on a small cluster; every (event, commands) pair, as text."""
    rng = random.Random(seed)
    nodes = tuple(NodeSpec(f"n{i}", Resources(cpu=rng.choice((4, 8)), memory_mb=16384)) for i in range(12))
    core = Core(ClusterSpec(nodes), CoreConfig(policy=policy, aging_s=0.5, aging_min_s=0.05,
                                               aging_relative=2.0))
    if not fill:  # the reference: the general pass, which `fill_node` shortcuts
        def general(self: SchedulingPass, node: object) -> None:
            self.run_pass(set(self.queues.shape_keys), [node], node.free.get(CPU, 0.0))  # type: ignore[attr-defined]
        core.scheduling.fill_node = general.__get__(core.scheduling)  # type: ignore[method-assign]
    log: list[str] = []
    running: list[str] = []
    t = 0.0

    def feed(event: object) -> None:
        cmds = core.handle(event)  # type: ignore[arg-type]
        log.append(f"{event!r} -> {cmds!r}")
        for c in cmds:
            if isinstance(c, StartAction):
                running.append(c.action.id)

    for i in range(700):
        t += rng.expovariate(40.0)
        r = rng.random()
        if r < 0.5:
            kind = rng.choice((ActionKind.CODE, ActionKind.TOOL, ActionKind.TEST))
            el = Elasticity(2, 6, speedup=Speedup(0.8)) if kind is ActionKind.TEST else None
            spec = ActionSpec(f"a{i}", kind=kind, demand=Resources(cpu=rng.choice((1, 2, 3, 4, 6)), memory_mb=512),
                              elasticity=el, hints=WorkHints(expected_s=rng.uniform(0.01, 2.0)),
                              tag=rng.choice((None, "python")))
            feed(ActionArrived(t, spec))
        elif r < 0.84 and running:
            aid = running.pop(rng.randrange(len(running)))
            feed(ActionFinished(t, aid, run_s=rng.uniform(0.01, 1.0)))
        elif r < 0.92 and running:
            feed(ActionStarted(t, rng.choice(running), "?"))
        elif r < 0.97:
            feed(WarmPoolReport(t, f"n{rng.randrange(12)}", rng.choice(("python", "code")), rng.randrange(3)))
        else:
            feed(Tick(t))
        core.validate()
    return log


@pytest.mark.pure_core
@pytest.mark.parametrize("policy", ["tangram", "fifo"])
@pytest.mark.parametrize("seed", [1, 5])
def test_one_node_pass_decides_as_the_general_pass(policy: str, seed: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    orig = SchedulingPass.fill_node

    def counting(self: SchedulingPass, node: object) -> None:
        nonlocal calls
        calls += 1
        orig(self, node)  # type: ignore[arg-type]

    monkeypatch.setattr(SchedulingPass, "fill_node", counting)
    fast = _run(seed, policy, fill=True)
    assert calls >= 10  # the shortcut was taken
    monkeypatch.undo()
    assert fast == _run(seed, policy, fill=False)


class _Reference:
    """The estimator's rule written plainly: last ``n`` unit times per (key, basis), quantile by
    index ``ceil(q * len) - 1`` of the sorted values, blended with the prior below 3 samples."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.vals: dict[tuple[str, str], list[float]] = {}
        self.count: dict[tuple[str, str], int] = {}

    def observe(self, spec: ActionSpec, run_s: float, speed: float) -> None:
        if not (run_s >= 0 and math.isfinite(run_s)):
            return
        basis, units = basis_of(spec.hints)
        key = (spec.estimator_key, basis)
        self.vals[key] = ([*self.vals.get(key, []), max(1e-6, run_s * max(speed, 1e-6) / units)])[-self.n:]
        self.count[key] = self.count.get(key, 0) + 1

    def predict(self, spec: ActionSpec, q: float) -> float:
        basis, units = basis_of(spec.hints)
        key = (spec.estimator_key, basis)
        vals, c, prior = sorted(self.vals.get(key, [])), self.count.get(key, 0), PRIORS[basis]
        if not c:
            return prior * units / 1.0
        v = vals[min(len(vals) - 1, max(0, math.ceil(q * len(vals)) - 1))]
        if c < 3:
            v = c / 3 * v + (1 - c / 3) * prior
        return v * units / 1.0


def test_estimator_work_api_matches_the_plain_rule() -> None:
    rng = random.Random(3)
    ref, est = _Reference(8), DurationEstimator(reservoir=8)
    specs = [ActionSpec("x", hints=WorkHints(expected_s=2.0)), ActionSpec("y", tag="py"),
             ActionSpec("z", kind=ActionKind.TEST, hints=WorkHints(test_count=7),
                        elasticity=Elasticity(1, 4, speedup=Speedup(0.9)))]
    for _ in range(400):
        spec = rng.choice(specs)
        q = rng.choice((0.5, 0.9))
        key, units = est.work_of(spec)
        assert est.predict_work(key, units, q) == ref.predict(spec, q) == est.predict(spec, q)
        run_s = rng.choice((rng.uniform(0, 3), 0.0, float("nan"), float("inf"), -1.0))
        speed = rng.choice((rng.uniform(0.5, 3), 0.0))
        ref.observe(spec, run_s, speed)
        if rng.random() < 0.5:
            est.observe_work(key, units, run_s, speed)
        else:
            est.observe(spec, run_s, speed)
