"""replay/predict.py's values (issue 43: item 2, the survivors of `make mutation` on it; item 1,
the replay's fidelity against hand-computed cases and a prediction error's denominator).

What is pinned, by hand: the measured trace (each action's cold start := the measured sandbox
start, each session's := the measured session open; a model action's work := its model's
``beta``, on an engine (``max_seqs > 0``) its tokens x the decode step alone ``alpha + beta``;
nothing else changed), the old spec's ``calibration.dispatch_s`` moved onto every node, what
`predict` hands the simulator (the measured trace and cluster, its config, the first step's
trajectories to size by), the optimum on the measured trace, a real run's bound on its own
releases (statuses by name, unknown ones left out, a timeout at its limit), and the fidelity
table: errors relative to the measured value, a policy the simulator did not run left out, the
ratios baseline / ours with ours chosen by name, a zero (or negative) denominator as inf."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, WorkHints
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay import predict as P
from arl_tangram.sim import runner
from arl_tangram.sim.trace import SessionDef, SimAction, Trajectory

# binary-exact figures: sums and products below are exact in floating point
RM = ModelSpec("rm", alpha=0.5, beta=0.25)  # batched model: one batch at a time
ENG = ModelSpec("eng", kind="genjudge", alpha=0.125, beta=0.0625, max_seqs=1)  # an engine


def _cluster(*nodes: NodeSpec) -> ClusterSpec:
    nodes = nodes or (NodeSpec("n0", Resources(cpu=4, memory_mb=8192)),)
    return ClusterSpec(tuple(nodes), (RM, ENG))


def _code(work: float = 2.0, cold: float = 0.875, model: str | None = None) -> SimAction:
    return SimAction(ActionKind.CODE, work, Resources(cpu=1, memory_mb=256), cold_start_s=cold,
                     model=model, session="s", timeout_s=30.0)


def _model(model: str, work: float = 5.0, tokens: int | None = None) -> SimAction:
    return SimAction(ActionKind.REWARD, work, Resources(), model=model, cold_start_s=0.75,
                     hints=WorkHints(tokens=tokens))


def _traj() -> Trajectory:
    steps = ((0.5, _code()),
             (0.25, _model("rm", tokens=100)),  # not an engine: beta, whatever its tokens
             (0.0, _model("rm")),
             (0.0, _model("eng", tokens=40)),  # an engine: 40 x (0.125 + 0.0625)
             (0.0, _model("eng")),  # an engine's action without tokens: beta
             (0.0, _model("ghost", work=3.0)),  # a model the cluster lacks: the trace's work
             (0.0, _code(1.5, model="rm")))  # a CPU action naming a model: its own work
    return Trajectory("t0", "code", steps, start=1.25,
                      sessions={"s": SessionDef(Resources(memory_mb=512), 60.0, 4.0)},
                      rl_step=3, siblings="g1")


# ---- measured_trace ---------------------------------------------------------------------------


def test_the_measured_trace_puts_this_machines_costs_in_place_of_the_traces() -> None:
    cal = {"cold_start_s": 1, "session_open_s": 2}
    ((t,),) = P.measured_trace([[_traj()]], _cluster(), cal)
    assert [a.work_s for _g, a in t.steps] == [2.0, 0.25, 0.25, 7.5, 0.0625, 3.0, 1.5]
    assert [a.cold_start_s for _g, a in t.steps] == [1.0] * 7
    assert all(type(a.cold_start_s) is float for _g, a in t.steps)
    assert [g for g, _a in t.steps] == [0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0]
    # nothing else of an action changes
    a0 = t.steps[0][1]
    assert (a0.kind, a0.demand, a0.session, a0.timeout_s, a0.model) == (
        ActionKind.CODE, Resources(cpu=1, memory_mb=256), "s", 30.0, None)
    assert t.steps[3][1].hints.tokens == 40 and t.steps[3][1].model == "eng"
    # the session's open := the measured one; its demand and ttl kept
    assert t.sessions == {"s": SessionDef(Resources(memory_mb=512), 60.0, 2.0)}
    assert type(t.sessions["s"].cold_start_s) is float
    # and the trajectory's own fields
    assert (t.id, t.task, t.start, t.rl_step, t.siblings) == ("t0", "code", 1.25, 3, "g1")


def test_without_measured_starts_the_traces_are_kept() -> None:
    ((t,),) = P.measured_trace([[_traj()]], _cluster(), {})
    assert [a.cold_start_s for _g, a in t.steps] == [0.875, 0.75, 0.75, 0.75, 0.75, 0.75, 0.875]
    assert t.sessions == {"s": SessionDef(Resources(memory_mb=512), 60.0, 4.0)}
    # the model work is measured whatever the calibration holds (the spec's alpha and beta)
    assert [a.work_s for _g, a in t.steps] == [2.0, 0.25, 0.25, 7.5, 0.0625, 3.0, 1.5]
    # only the session's open may be given, or only the sandbox's
    ((t,),) = P.measured_trace([[_traj()]], _cluster(), {"session_open_s": 0.5})
    assert t.steps[0][1].cold_start_s == 0.875 and t.sessions["s"].cold_start_s == 0.5
    ((t,),) = P.measured_trace([[_traj()]], _cluster(), {"cold_start_s": 0.5})
    assert t.steps[0][1].cold_start_s == 0.5 and t.sessions["s"].cold_start_s == 4.0


def test_the_measured_trace_keeps_the_steps_and_their_trajectories_in_order() -> None:
    a, b, c = (Trajectory(n, "x", ((0.0, _code()),)) for n in ("a", "b", "c"))
    out = P.measured_trace([[a, b], [c]], _cluster(), {})
    assert isinstance(out, list) and all(isinstance(x, list) for x in out)
    assert [[t.id for t in batch] for batch in out] == [["a", "b"], ["c"]]
    assert P.measured_trace([], _cluster(), {}) == []


def test_the_measured_trace_keeps_a_sessions_image() -> None:
    """(A defect helper-36's tests found: the measured trace rebuilt each session from its
    demand, TTL and cold start and dropped its image, so the prediction of a trace whose
    sessions run in an environment image never saw the simulator's warm key image:NAME.)"""
    t = Trajectory("t", "swe", ((0.0, _code()),),
                   sessions={"s": SessionDef(Resources(memory_mb=512), 60.0, 4.0, image="py")})
    ((m,),) = P.measured_trace([[t]], _cluster(), {"session_open_s": 2.0})
    assert m.sessions["s"] == SessionDef(Resources(memory_mb=512), 60.0, 2.0, image="py")
    ((m,),) = P.measured_trace([[t]], _cluster(), {})  # (no session open measured: as it was)
    assert m.sessions["s"] == SessionDef(Resources(memory_mb=512), 60.0, 4.0, image="py")


# ---- measured_cluster -------------------------------------------------------------------------


def test_an_old_specs_dispatch_costs_move_onto_every_node() -> None:
    c = _cluster(NodeSpec("n0", Resources(cpu=4)), NodeSpec("n1", Resources(cpu=2)))
    cal = {"dispatch_s": {"code": 1, "test": 0.0061234, "tool_session": 0.003}}
    m = P.measured_cluster(c, cal)
    want = {"default": 1.0, "test": 0.00612, "tool": 0.003}
    assert [dict(n.dispatch_s) for n in m.nodes] == [want, want]
    assert [n.name for n in m.nodes] == ["n0", "n1"]
    assert [n.capacity for n in m.nodes] == [Resources(cpu=4), Resources(cpu=2)]
    assert m.models == c.models


def test_a_spec_with_node_dispatch_costs_or_without_the_old_section_is_kept() -> None:
    cal = {"dispatch_s": {"code": 0.5}}
    # one node already has the field (a spec of after it existed): nothing moves, to any node
    c = _cluster(NodeSpec("n0", Resources(cpu=4)),
                 NodeSpec("n1", Resources(cpu=2), dispatch_s={"default": 0.25}))
    assert P.measured_cluster(c, cal) is c
    c2 = _cluster()
    assert P.measured_cluster(c2, {}) is c2
    assert P.measured_cluster(c2, {"dispatch_s": 0.5}) is c2  # not a mapping: not the old form
    assert P.measured_cluster(c2, cal).nodes[0].dispatch_s == {"default": 0.5}


# ---- predict ----------------------------------------------------------------------------------


class _Seen:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, cluster: ClusterSpec, batches: Any, policy: str, *, workload: str,
                 config: Any, shares_from: Any) -> Any:
        self.calls.append({"cluster": cluster, "batches": batches(), "policy": policy,
                           "workload": workload, "config": config, "shares_from": shares_from})
        return "report"


def test_predict_runs_the_simulator_on_the_measured_trace_and_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _Seen()
    monkeypatch.setattr(runner, "run_policy", seen)
    c = _cluster()
    t1, t2 = _traj(), Trajectory("t1", "x", ((0.0, _code()),), rl_step=1)
    cal = {"cold_start_s": 0.25, "session_open_s": 0.5, "dispatch_s": {"code": 0.125}}
    got = P.predict(c, [[t1], [t2]], "fifo", cal, train_s=3.0, tick_s=0.125, label="demo")
    assert got == "report"
    (call,) = seen.calls
    mc = P.measured_cluster(c, cal)
    assert call["cluster"] == mc and call["cluster"].nodes[0].dispatch_s == {"default": 0.125}
    assert call["batches"] == P.measured_trace([[t1], [t2]], mc, cal)
    assert call["batches"][0][0].steps[0][1].cold_start_s == 0.25
    assert call["policy"] == "fifo" and call["workload"] == "demo"
    cfg = call["config"]
    assert (cfg.train_s, cfg.tick_s, cfg.warm_cold_start_s) == (3.0, 0.125, 0.25)
    # the static policies are sized by the first step's trajectories, as the trace gives them
    assert call["shares_from"] == [t1]


def test_predicts_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _Seen()
    monkeypatch.setattr(runner, "run_policy", seen)
    P.predict(_cluster(), [[_traj()]], "tangram", {})
    P.predict(_cluster(), [], "tangram", {"cold_start_s": 2})
    first, empty = seen.calls
    cfg = first["config"]
    assert (cfg.train_s, cfg.tick_s, cfg.warm_cold_start_s) == (0.0, 0.5, 0.57)
    assert first["workload"] == "?"
    assert empty["shares_from"] == [] and empty["batches"] == []
    assert empty["config"].warm_cold_start_s == 2.0


def test_predict_on_a_real_simulation_counts_the_traces_actions() -> None:
    a = SimAction(ActionKind.CODE, 1.0, Resources(cpu=1, memory_mb=256))
    steps = [[Trajectory("a", "x", ((0.0, a), (0.0, a)))]]
    rep = P.predict(_cluster(), steps, "fifo", {"cold_start_s": 0.0})
    assert rep.act["count"] == 2 and rep.act["avg"] >= 1.0


# ---- optimum and run_bound --------------------------------------------------------------------


def test_the_optimum_is_taken_on_the_measured_trace() -> None:
    # a reward action of rm alone: alpha + its measured work (beta) = 0.5 + 0.25 = 0.75 (the
    # trace's 5 s of work would give 5.5); a code action: its work, 2 s; avg (0.75 + 2) / 2
    c = _cluster()
    steps = [[Trajectory("a", "x", ((0.0, _model("rm")),)),
              Trajectory("b", "x", ((0.0, _code(2.0)),))]]
    assert P.optimum(c, steps, {"cold_start_s": 9.0}) == pytest.approx(1.375)
    assert P.optimum(c, steps[:1][:1], {}, train_s=5.0) == pytest.approx(1.375)
    one = [[Trajectory("a", "x", ((0.0, _model("rm")),))]]
    assert P.optimum(c, one, {}) == 0.75
    assert type(P.optimum(c, one, {})) is float
    # the engine's judgement: 40 tokens x (0.125 + 0.0625) = 7.5 s of work, at the least that
    one_eng = [[Trajectory("a", "x", ((0.0, _model("eng", tokens=40)),))]]
    assert P.optimum(c, one_eng, {}) >= 7.5


def test_a_run_bound_reads_statuses_by_name_and_leaves_out_unknown_ones() -> None:
    c = _cluster()
    steps = [[Trajectory("a", "x", ((0.0, _code(2.0)), (0.0, _code(1.0)))),
              Trajectory("b", "x", ((0.0, _code(4.0)),))]]
    # a alone (2 s), a's second action at 10 s (1 s), b timed out: its limit, 30 s
    rep = SimpleNamespace(releases=[("a", 0, 0.0, "Succeeded"), ("a", 1, 10.0, "succeeded"),
                                    ("b", 0, 20.0, "timed_out"), ("b", 0, 0.0, "no-such"),
                                    ("b", 0, 0.0, "queued")])
    got = P.run_bound(c, steps, {}, rep)
    assert got["count"] == 3
    assert got["act_avg"] == pytest.approx((2.0 + 1.0 + 30.0) / 3)


# ---- err and fidelity -------------------------------------------------------------------------


def test_an_error_is_over_the_measured_value_and_a_zero_measure_is_inf_unless_both_are() -> None:
    assert P.err(2.0, 3.0) == 0.5
    assert P.err(8.0, 2.0) == -0.75
    assert P.err(1.0, 1.0) == 0.0
    assert P.err(0.0, 0.0) == 0.0
    assert P.err(0.0, 0.5) == math.inf and P.err(0.0, -0.5) == math.inf
    assert P.err(-2.0, 1.0) == -1.5


def _rep(avg: float, step: float, *, p50: float = 1.0, p99: float = 2.0, cpu: float = 0.25,
         util: dict[str, float] | None = None) -> Any:
    return SimpleNamespace(act={"avg": avg, "p50": p50, "p99": p99}, step_avg_s=step,
                           cpu_utilization=cpu, utilization={"cpu": cpu} if util is None else util)


def test_fidelity_rows_each_policy_the_simulator_also_ran() -> None:
    real = {"fifo": _rep(4.0, 8.0), "task-isolated": _rep(2.0, 4.0, p50=0.5, p99=4.0, cpu=0.5),
            "trajectory-bound": _rep(1.0, 1.0)}
    sim = {"task-isolated": _rep(3.0, 2.0, p50=1.0, p99=3.0, util={"gpu": 0.5}),
           "trajectory-bound": _rep(1.5, 1.5)}
    f = P.fidelity(real, sim)
    assert list(f["policies"]) == ["task-isolated", "trajectory-bound"]  # fifo: not simulated
    assert f["policies"]["task-isolated"] == {
        "act_avg": {"measured": 2.0, "predicted": 3.0, "error": 0.5},
        "act_p50": {"measured": 0.5, "predicted": 1.0, "error": 1.0},
        "act_p99": {"measured": 4.0, "predicted": 3.0, "error": -0.25},
        "step": {"measured": 4.0, "predicted": 2.0, "error": -0.5},
        # the simulator reported no CPU utilization: 0
        "utilization_cpu": {"measured": 0.5, "predicted": 0.0},
    }
    assert f["ratios"] == {}  # no "tangram" run: no ratios


def test_fidelity_ratios_are_baseline_over_ours_by_name() -> None:
    real = {"fifo": _rep(4.0, 8.0), "mine": _rep(2.0, 2.0), "static-pool:1": _rep(3.0, 6.0)}
    sim = {"fifo": _rep(3.0, 4.0), "mine": _rep(1.5, 4.0), "static-pool:1": _rep(6.0, 2.0)}
    f = P.fidelity(real, sim, ours="mine")
    # fifo: measured 4 / 2 = 2, predicted 3 / 1.5 = 2 (error 0); step 8 / 2 = 4 vs 4 / 4 = 1;
    # static-pool:1: 3 / 2 = 1.5 vs 6 / 1.5 = 4, error (4 - 1.5) / 1.5 = 5/3; step 3 vs 0.5
    assert f["ratios"] == {
        "fifo": {"act_avg": {"measured": 2.0, "predicted": 2.0, "error": 0.0},
                 "step": {"measured": 4.0, "predicted": 1.0, "error": -0.75}},
        "static-pool:1": {"act_avg": {"measured": 1.5, "predicted": 4.0, "error": 5 / 3},
                          "step": {"measured": 3.0, "predicted": 0.5, "error": -5 / 6}},
    }
    # ours run for real only, or simulated only: no ratios
    assert P.fidelity(real, {k: v for k, v in sim.items() if k != "mine"}, ours="mine")[
        "ratios"] == {}
    assert P.fidelity({k: v for k, v in real.items() if k != "mine"}, sim, ours="mine")[
        "ratios"] == {}


def test_a_ratio_over_nothing_is_inf() -> None:
    assert P._ratio(3.0, 2.0) == 1.5
    assert P._ratio(0.75, 0.5) == 1.5 and P._ratio(2.0, 1.0) == 2.0  # any positive denominator
    assert P._ratio(3.0, 0.0) == math.inf and P._ratio(0.0, 0.0) == math.inf
    assert P._ratio(3.0, -1.0) == math.inf
    real = {"tangram": _rep(0.0, 2.0), "fifo": _rep(4.0, 4.0)}
    sim = {"tangram": _rep(2.0, 2.0), "fifo": _rep(4.0, 4.0)}
    r = P.fidelity(real, sim)["ratios"]["fifo"]
    assert r["act_avg"]["measured"] == math.inf and r["act_avg"]["predicted"] == 2.0
    assert r["step"] == {"measured": 2.0, "predicted": 2.0, "error": 0.0}
