"""The comparison's rows and the replay's fidelity against hand-computed cases (issue 43).

- "best static" is the static-pool run with the *lowest* average ACT among those that did not
  stall, a tie broken by the label (the same row every run);
- the static policies are sized by the trajectories with CPU work only (a trajectory that only
  calls a model holds no sandbox slice), and each task's pool by its CPU actions only;
- a prediction's error is relative to the *measured* value; ratios are baseline / ours.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay.predict import err, fidelity
from arl_tangram.sim.runner import best_static, measured_task_shares, ratios, run_policy, uses_cpu
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import SimAction, Trajectory


def _rep(avg: float, *, p50: float | None = None, p99: float | None = None, step: float = 1.0,
         stalled: bool = False, cpu: float = 0.0) -> Any:
    return SimpleNamespace(act={"avg": avg, "p50": avg if p50 is None else p50,
                                "p99": avg if p99 is None else p99},
                           step_avg_s=step, stalled=stalled, cpu_utilization=cpu,
                           utilization={"cpu": cpu})


def test_best_static_is_the_lowest_average_act_of_the_unstalled_static_runs() -> None:
    reports = {"tangram": _rep(1.0), "fifo": _rep(0.5),  # not static: never the row
               "static-pool:1": _rep(4.0), "static-pool:2": _rep(2.5),
               "static-pool:4": _rep(3.0), "static-pool:max": _rep(0.1, stalled=True)}
    assert best_static(reports) == "static-pool:2"
    assert best_static({"tangram": _rep(1.0)}) is None
    assert best_static({"static-pool:1": _rep(1.0, stalled=True)}) is None


def test_a_tie_in_average_act_picks_the_first_label() -> None:
    reports = {"static-pool:max": _rep(2.0), "static-pool:4": _rep(2.0), "static-pool:2": _rep(2.0),
               "static-pool:8": _rep(3.0)}
    assert best_static(reports) == "static-pool:2"
    assert best_static(dict(reversed(list(reports.items())))) == "static-pool:2"


def _cpu(work: float = 2.0, cpu: float = 1.0) -> SimAction:
    return SimAction(ActionKind.CODE, work, Resources(cpu=cpu, memory_mb=256))


def _judge(work: float = 2.0) -> SimAction:
    # (a model's action may name CPU in its demand: it still runs on the model, not a sandbox)
    return SimAction(ActionKind.REWARD, work, Resources(cpu=1), model="rm")


def test_the_sizing_counts_only_the_trajectories_and_actions_on_cpu() -> None:
    trajs = [Trajectory("c0", "code", ((0.0, _cpu()),)),
             Trajectory("c1", "code", ((0.0, _cpu()), (0.0, _judge(50.0)))),
             Trajectory("j0", "judge", ((0.0, _judge()),)),
             Trajectory("j1", "judge", ((0.0, _judge()),)),
             Trajectory("j2", "judge", ((0.0, _judge()),))]
    assert [uses_cpu(t) for t in trajs] == [True, True, False, False, False]
    cluster = ClusterSpec((NodeSpec("n0", Resources(cpu=4, memory_mb=8192)),))
    # c0 and c1 run their 2 s code actions at once: 2 cores for "code"; the judge's 50 s after
    # c1's action, and the judge-only task, count nothing
    assert measured_task_shares(trajs, cluster) == {"code": 2.0}
    seen: list[tuple[str, int, dict[str, float]]] = []

    class _Sized(Exception):
        pass

    def factory(cluster: ClusterSpec, policy: str, n: int, shares: Any, **kw: Any) -> Any:
        seen.append((policy, n, dict(shares)))
        raise _Sized

    for policy in ("trajectory-bound", "task-isolated"):
        with pytest.raises(_Sized):
            run_policy(cluster, lambda: [trajs], policy, config=SimConfig(train_s=1.0),
                       core_factory=factory)
    assert seen == [("trajectory-bound", 2, {}), ("task-isolated", 2, {"code": 2.0})]


def test_a_prediction_error_is_relative_to_the_measured_value() -> None:
    assert err(4.0, 5.0) == 0.25  # (5 - 4) / 4, not / 5 (0.2)
    assert err(5.0, 4.0) == -0.2
    assert err(0.0, 0.0) == 0.0 and err(0.0, 1.0) == math.inf
    real = {"tangram": _rep(2.0, p50=1.0, p99=8.0, step=10.0, cpu=0.5),
            "fifo": _rep(4.0, step=20.0)}
    sim = {"tangram": _rep(2.5, p50=1.0, p99=6.0, step=8.0, cpu=0.6), "fifo": _rep(3.0, step=16.0)}
    f = fidelity(real, sim)
    t = f["policies"]["tangram"]
    assert t["act_avg"] == {"measured": 2.0, "predicted": 2.5, "error": 0.25}
    assert t["act_p50"]["error"] == 0.0 and t["act_p99"]["error"] == -0.25
    assert t["step"] == {"measured": 10.0, "predicted": 8.0, "error": -0.2}
    assert t["utilization_cpu"] == {"measured": 0.5, "predicted": 0.6}
    # fifo / tangram: measured 4 / 2 = 2.0, predicted 3 / 2.5 = 1.2: error (1.2 - 2) / 2 = -0.4
    ra = f["ratios"]["fifo"]["act_avg"]
    assert ra["measured"] == 2.0 and ra["predicted"] == pytest.approx(1.2)
    assert ra["error"] == pytest.approx(-0.4)
    assert f["ratios"]["fifo"]["step"] == {"measured": 2.0, "predicted": 2.0, "error": 0.0}
    assert "tangram" not in f["ratios"]


def test_the_comparison_ratios_are_baseline_over_ours() -> None:
    reps = {"tangram": _rep(2.0, p50=1.0, p99=4.0, step=5.0),
            "fifo": _rep(6.0, p50=1.5, p99=4.0, step=10.0), "idle": _rep(0.0, step=0.0)}
    assert ratios(reps) == {"fifo": {"act_avg": 3.0, "act_p50": 1.5, "act_p99": 1.0, "step": 2.0},
                            "idle": {"act_avg": 0.0, "act_p50": 0.0, "act_p99": 0.0, "step": 0.0}}
