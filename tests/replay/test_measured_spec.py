"""The measured node fields of a cluster spec (`parallel_speedup`, `parallel_start_s`,
`dispatch_s`) and the
`calibration:` section: parsed with file:line: field errors (exit 2), applied by the simulator's
virtual executor. No sandboxes: these run anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arl_tangram.cli.main import main
from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import Resources
from arl_tangram.sim.executor import VirtualExecutor
from arl_tangram.sim.loop import EventLoop
from arl_tangram.sim.trace import SimAction
from arl_tangram.specfile import load_cluster_yaml

GOOD = """\
nodes:
  - name: local
    capacity: {cpu: 4, memory_mb: 4096}
    parallel_speedup: {2: 1.5, 4: 2.5}
    parallel_start_s: {2: 0.004}
    dispatch_s: {default: 0.002, test: 0.006}
"""


def test_measured_fields_parse(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(GOOD)
    (node,) = load_cluster_yaml(p).nodes
    assert node.parallel_speedup == ((2.0, 1.5), (4.0, 2.5))
    assert node.dispatch_for("test") == 0.006 and node.dispatch_for("code") == 0.002
    # (1, 1) -> (2, 1.5) -> (4, 2.5), then the last point's efficiency
    assert node.parallel_cores(0.5) == 0.5 and node.parallel_cores(1.0) == 1.0
    assert node.parallel_cores(1.5) == pytest.approx(1.25)
    assert node.parallel_cores(3.0) == pytest.approx(2.0)
    assert node.parallel_cores(8.0) == pytest.approx(5.0)
    plain = NodeSpec("n", Resources(cpu=4))
    assert plain.parallel_cores(3.0) == 3.0 and plain.dispatch_for("code") == 0.0
    # the start cost: nothing up to one core, (1, 0) -> (2, 4 ms), then per worker past the first
    assert node.parallel_start_s == ((2.0, 0.004),)
    assert node.parallel_start_for(1.0) == 0.0 and node.parallel_start_for(0.5) == 0.0
    assert node.parallel_start_for(1.5) == pytest.approx(0.002)
    assert node.parallel_start_for(2.0) == pytest.approx(0.004)
    assert node.parallel_start_for(4.0) == pytest.approx(0.012)
    assert plain.parallel_start_for(4.0) == 0.0


@pytest.mark.parametrize(
    ("extra", "line", "field"),
    [
        ("    parallel_speedup: {2: 2.5}\n", 4, "nodes[0].parallel_speedup.2"),  # faster than ideal
        ("    parallel_speedup: {1: 1.0}\n", 4, "nodes[0].parallel_speedup.1"),  # not > 1 core
        ("    parallel_speedup: {2: -1}\n", 4, "nodes[0].parallel_speedup.2"),
        ("    parallel_speedup: 1.6\n", 2, "nodes[0].parallel_speedup"),  # not a table
        ("    parallel_speedup:\n      2: 1.2\n      4: abc\n", 5, "nodes[0].parallel_speedup.4"),
        ("    parallel_start_s: {2: -0.001}\n", 4, "nodes[0].parallel_start_s.2"),
        ("    parallel_start_s: {1: 0.001}\n", 4, "nodes[0].parallel_start_s.1"),  # not > 1 core
        ("    parallel_start_s: {2: fast}\n", 4, "nodes[0].parallel_start_s.2"),
        ("    parallel_start_s: 0.003\n", 2, "nodes[0].parallel_start_s"),  # not a table
        ("    dispatch_s: -0.1\n", 2, "nodes[0].dispatch_s"),
        ("    dispatch_s: {code: x}\n", 4, "nodes[0].dispatch_s.code"),
        ("    dispatch_s: {sandbox: 0.1}\n", 4, "nodes[0].dispatch_s.sandbox"),  # not a kind
    ],
)
def test_bad_measured_fields_name_file_line_field(
    tmp_path: Path, extra: str, line: int, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("nodes:\n  - name: local\n    capacity: {cpu: 2, memory_mb: 1024}\n" + extra)
    with pytest.raises(SpecError) as ei:
        load_cluster_yaml(p)
    assert str(ei.value).startswith(f"{p}:{line}: {field}:"), str(ei.value)
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"id": "a", "steps": [[0.1, {"kind": "code", "work_s": 0.1}]]}) + "\n"
    )
    assert main(["simulate", "--trace", str(trace), "--cluster", str(p)]) == 2
    assert f"{p}:{line}: {field}:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("calibration: {units_per_s: 0}\n", "calibration.units_per_s"),
        ("calibration: {cold_start_s: -1}\n", "calibration.cold_start_s"),
        ("calibration: {session_open_s: fast}\n", "calibration.session_open_s"),
        ("calibration: {speed_of_light: 1}\n", "calibration.speed_of_light"),
    ],
)
def test_bad_calibration_section_exits_2_before_anything_runs(
    tmp_path: Path, section: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("nodes:\n  - name: local\n    capacity: {cpu: 2, memory_mb: 1024}\n" + section)
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"id": "a", "steps": [[0.1, {"kind": "code", "work_s": 0.1}]]}) + "\n"
    )
    assert main(["replay", "--trace", str(trace), "--cluster", str(p), "--policy", "fifo"]) == 2
    assert f"{p}:4: {field}:" in capsys.readouterr().err


# ---- the virtual executor applies them ------------------------------------------------------------


def _run(
    node: NodeSpec,
    spec: ActionSpec,
    work_s: float,
    cpus: float,
    resize_at: float | None = None,
    resize_to: float = 1.0,
) -> list[E.Event]:
    loop = EventLoop()
    events: list[E.Event] = []
    truth = {spec.id: SimAction(spec.kind, work_s=work_s, cold_start_s=0.0)}
    ex = VirtualExecutor(loop, ClusterSpec((node,)), truth, events.append)
    ex.execute(C.StartAction(spec, node.name, Resources(cpu=cpus, memory_mb=100), warm=False))
    if resize_at is not None:
        loop.run(until=resize_at)
        ex.execute(C.ResizeAction(spec.id, node.name, Resources(cpu=resize_to, memory_mb=100)))
    loop.run()
    return events


def _elastic(p: float, kind: ActionKind = ActionKind.TEST) -> ActionSpec:
    return ActionSpec(
        "a",
        kind,
        Resources(cpu=1, memory_mb=100),
        Elasticity(1, 4, speedup=Speedup(p)),
        timeout_s=1000,
    )


def _finish(events: list[E.Event]) -> float:
    return next(e.time for e in events if isinstance(e, E.ActionFinished))


def test_executor_shares_the_measured_cores_of_a_node() -> None:
    ideal = NodeSpec("n", Resources(cpu=4, memory_mb=4096))
    real = NodeSpec("n", Resources(cpu=4, memory_mb=4096), parallel_speedup=((2.0, 1.5),))
    assert _finish(_run(ideal, _elastic(1.0), 3.0, 2.0)) == pytest.approx(1.5)  # ideal: 2x
    assert _finish(_run(real, _elastic(1.0), 3.0, 2.0)) == pytest.approx(2.0)  # measured: 1.5x
    # Amdahl's speed (p = 0.5 on 2 cores: 4/3) times the node's share at 2 busy cores (0.75)
    assert _finish(_run(real, _elastic(0.5), 3.0, 2.0)) == pytest.approx(3.0 / (4 / 3 * 0.75))
    # one core, and a rigid action alone, are as before
    assert _finish(_run(real, _elastic(1.0), 3.0, 1.0)) == pytest.approx(3.0)
    rigid = ActionSpec("a", ActionKind.CODE, Resources(cpu=1, memory_mb=100), timeout_s=1000)
    assert _finish(_run(real, rigid, 3.0, 1.0)) == pytest.approx(3.0)


def test_two_rigid_actions_at_once_share_what_two_busy_cores_give() -> None:
    node = NodeSpec("n", Resources(cpu=4, memory_mb=4096), parallel_speedup=((2.0, 1.5),))
    loop = EventLoop()
    events: list[E.Event] = []
    rigid = [
        ActionSpec(i, ActionKind.CODE, Resources(cpu=1, memory_mb=100), timeout_s=1000)
        for i in ("a", "b")
    ]
    truth = {
        "a": SimAction(ActionKind.CODE, work_s=3.0, cold_start_s=0.0),
        "b": SimAction(ActionKind.CODE, work_s=1.5, cold_start_s=0.0),
    }
    ex = VirtualExecutor(loop, ClusterSpec((node,)), truth, events.append)
    for spec in rigid:
        ex.execute(C.StartAction(spec, "n", Resources(cpu=1, memory_mb=100), warm=False))
    loop.run()
    done = {e.action_id: e.time for e in events if isinstance(e, E.ActionFinished)}
    # both at 0.75 until b is done (1.5 / 0.75 = 2 s, a has 1.5 s left), then a alone at 1
    assert done["b"] == pytest.approx(2.0) and done["a"] == pytest.approx(3.5)


def test_executor_recomputes_the_measured_speed_on_resize() -> None:
    real = NodeSpec("n", Resources(cpu=4, memory_mb=4096), parallel_speedup=((2.0, 1.5),))
    # 1 s at one core, then 2 s of work left at 1.5x
    assert _finish(
        _run(real, _elastic(1.0), 3.0, 1.0, resize_at=1.0, resize_to=2.0)
    ) == pytest.approx(1.0 + 2.0 / 1.5)


def test_executor_charges_dispatch_once_unstretched_by_the_allotment() -> None:
    node = NodeSpec(
        "n", Resources(cpu=4, memory_mb=4096), dispatch_s={"default": 0.5, "test": 0.25}
    )
    rigid = ActionSpec("a", ActionKind.CODE, Resources(cpu=1, memory_mb=100), timeout_s=1000)
    ev = _run(node, rigid, 1.0, 0.25)  # a quarter-core slice: the work 4x, the dispatch not
    started = next(e for e in ev if isinstance(e, E.ActionStarted))
    assert started.time == 0.0 and started.cold_start_s == 0.0  # not a cold start to the core
    # (the work: its first 0.05 s at full speed, the CFS quota in hand, the rest 4x: `cfs_speed`)
    assert _finish(ev) == pytest.approx(0.5 + 0.05 + 0.95 * 4)
    assert _finish(_run(node, _elastic(1.0), 2.0, 2.0)) == pytest.approx(0.25 + 1.0)  # per kind
    # a resize during the dispatch: no work done yet, all of it at the new speed
    assert _finish(
        _run(node, _elastic(1.0), 2.0, 1.0, resize_at=0.1, resize_to=2.0)
    ) == pytest.approx(0.25 + 1.0)


def test_a_real_runs_bound_is_taken_on_its_own_submit_times() -> None:
    # what `tangram replay` shows beside each policy: the bound (sim.bounds) on the run's own
    # releases, in the calibrated trace's terms. Two elastic tests of 2 s (1..2 cores, p 0.9)
    # submitted together on 2 cores: SRPT of their least core-seconds ends them at 1 and 2 s
    # (1.5 on average, above each alone: 1.1); submitted 10 s apart they never meet (1.1).
    from types import SimpleNamespace

    from arl_tangram.replay.predict import run_bound
    from arl_tangram.sim.trace import Trajectory

    test = SimAction(ActionKind.TEST, 2.0, Resources(cpu=1), Elasticity(1, 2, speedup=Speedup(0.9)))
    steps = [[Trajectory("a", "x", ((0.0, test),)), Trajectory("b", "x", ((0.0, test),))]]
    cluster = ClusterSpec((NodeSpec("n", Resources(cpu=2, memory_mb=4096)),))
    together = SimpleNamespace(releases=[("a", 0, 0.0, "succeeded"), ("b", 0, 0.0, "succeeded")])
    apart = SimpleNamespace(releases=[("a", 0, 0.0, "succeeded"), ("b", 0, 10.0, "succeeded")])
    assert run_bound(cluster, steps, {}, together)["act_avg"] == pytest.approx(1.5)
    assert run_bound(cluster, steps, {}, apart)["act_avg"] == pytest.approx(1.1)
    # a failed action may not have run: it counts in the ACT's count, for nothing
    failed = SimpleNamespace(releases=[("a", 0, 0.0, "succeeded"), ("b", 0, 0.0, "failed")])
    got = run_bound(cluster, steps, {}, failed)
    assert got["count"] == 2 and got["act_avg"] == pytest.approx(1.1 / 2)
