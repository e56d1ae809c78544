"""`sim/runner.py`'s values, pinned (issue 43 item 2: its mutmut survivors).

What a user of `tangram simulate --compare` / `--savings` reads: the policy labels, the
comparison's ratios (baseline / ours; inf where ours took no time and the baseline did), each
report's policy, workload and seed, which clusters `savings` tried (its binary search, in order)
and the scale, nodes and capacity saved it reports. `savings`' search is pinned with a stand-in
for `run_policy` whose ACT and step depend on the cluster's node counts only (the figures worked
by hand in the comments); `compare` and `run_policy` run the real core on one-action traces.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim import runner
from arl_tangram.sim.runner import Savings, compare, ratios, savings
from arl_tangram.sim.simulator import SimConfig
from arl_tangram.sim.trace import SimAction, Trajectory


def _rep(avg: float, *, p50: float | None = None, p99: float | None = None, step: float = 1.0,
         stalled: bool = False, policy: str = "x") -> Any:
    return SimpleNamespace(act={"avg": avg, "p50": avg if p50 is None else p50,
                                "p99": avg if p99 is None else p99},
                           step_avg_s=step, stalled=stalled, policy=policy)


# ---- ratios ---------------------------------------------------------------------------------------


def test_a_ratio_over_a_zero_of_ours_is_inf_and_zero_over_zero_is_one() -> None:
    reps = {"tangram": _rep(0.0, p50=2.0, p99=0.0, step=0.0),
            "fifo": _rep(3.0, p50=0.0, p99=0.5, step=0.0)}
    # act_avg 3 / 0: inf; p50 0 / 2: 0; p99 0.5 / 0 (0.5 < 1): inf; step 0 / 0: 1
    assert ratios(reps) == {"fifo": {"act_avg": float("inf"), "act_p50": 0.0,
                                     "act_p99": float("inf"), "step": 1.0}}
    # another policy as ours: fifo's figures in the denominator
    assert ratios({"a": _rep(4.0, step=2.0), "b": _rep(2.0, step=4.0)}, ours="b") == {
        "a": {"act_avg": 2.0, "act_p50": 2.0, "act_p99": 2.0, "step": 0.5}}


# ---- compare ------------------------------------------------------------------------------------------


def _cluster() -> ClusterSpec:
    return ClusterSpec((NodeSpec("n0", Resources(cpu=4, memory_mb=8192)),))


def _one_action() -> list[Trajectory]:
    # 1 s of generation, then a 2 s code action on one core
    return [Trajectory("t0", "code", ((1.0, SimAction(ActionKind.CODE, 2.0,
                                                        Resources(cpu=1, memory_mb=256))),))]


def test_compare_passes_seed_workload_and_config_to_every_run_in_order() -> None:
    seen: list[str] = []
    trajs = _one_action()
    got = compare(_cluster(), lambda: [trajs], names=("fifo", "static-pool:1"), seed=7,
                  workload="w", config=SimConfig(train_s=3.0),
                  on_report=lambda r: seen.append(r.policy))
    assert list(got) == ["fifo", "static-pool:1"] and seen == ["fifo", "static-pool:1"]
    for name, r in got.items():
        assert (r.policy, r.workload, r.seed, r.actions, r.stalled) == (name, "w", 7, 1, False)
        assert r.act["avg"] == 2.0
        assert r.step_s == (6.0,)  # 1 s generation + 2 s action + 3 s training


def test_compare_defaults_seed_0_workload_question_mark_and_no_training() -> None:
    trajs = _one_action()
    (r,) = compare(_cluster(), lambda: [trajs], names=("fifo",)).values()
    assert (r.policy, r.workload, r.seed, r.actions) == ("fifo", "?", 0, 1)
    assert r.step_s == (3.0,)


def test_compare_and_savings_of_an_empty_replay_run_nothing() -> None:
    (r,) = compare(_cluster(), lambda: [], names=("fifo",)).values()
    assert (r.actions, r.step_s, r.stalled) == (0, (), False)


# ---- savings ------------------------------------------------------------------------------------------


def _two_pools() -> ClusterSpec:
    cpu = tuple(NodeSpec(f"c{i}", Resources(cpu=4, memory_mb=1000), pool="cpu") for i in range(8))
    gpu = tuple(NodeSpec(f"g{i}", Resources(cpu=2, gpu=4, memory_mb=1000), pool="gpu")
                for i in range(3))
    return ClusterSpec(cpu + gpu)


class _Runs:
    """A stand-in for `run_policy`: ACT 16 / (CPU nodes), step ``step(gpu nodes)``; records the
    node counts and the arguments of each run."""

    def __init__(self, step: Any = lambda g: 10.0, stalled: Any = lambda c, g: False) -> None:
        self.step, self.stalled = step, stalled
        self.calls: list[tuple[int, int]] = []
        self.args: list[tuple[str, Any, Any, Any, Any]] = []

    def __call__(self, cluster: ClusterSpec, batches: Any, policy: str, *, seed: int,
                 workload: str, config: Any, shares_from: Any) -> Any:
        c = sum(1 for n in cluster.nodes if n.pool == "cpu")
        g = sum(1 for n in cluster.nodes if n.pool == "gpu")
        self.calls.append((c, g))
        self.args.append((policy, seed, workload, config, shares_from))
        return SimpleNamespace(act={"avg": 16.0 / c}, step_avg_s=self.step(g),
                               stalled=self.stalled(c, g), policy=policy)


def test_savings_searches_the_scale_in_halves_and_runs_each_cluster_once(monkeypatch) -> None:
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    base = _rep(4.0, step=10.0, policy="fifo")
    s = savings(_two_pools(), lambda: [["first"], ["second"]], base)
    # 7 halvings from [0, 1]: 1.0 ok (8 CPU nodes, 3 GPU nodes: ACT 2); 0.5 (4, 2): ACT 4 = the
    # target, ok; 0.25 (2, 1): 8, no; 0.375 (round(3) = 3, 1): 5.33, no; 0.4375 (round(3.5) = 4,
    # 1): 4, ok; 0.40625, 0.421875, 0.4296875: 3 CPU nodes and 1 GPU node again, no, not re-run
    assert runs.calls == [(8, 3), (4, 2), (2, 1), (3, 1), (4, 1)]
    assert s.tried == ((1.0, 2.0, 10.0), (0.5, 4.0, 10.0), (0.25, 8.0, 10.0),
                       (0.375, 16.0 / 3, 10.0), (0.4375, 4.0, 10.0))
    assert s.baseline == "fifo"
    assert s.scale == 5 / 11  # the kept fraction of the nodes (4 + 1 of 8 + 3), not 0.4375
    assert s.nodes == {"cpu": (4, 8), "gpu": (1, 3)}
    # CPU: 4 x 4 + 1 x 2 = 18 kept of 38; GPU: 4 of 12
    assert s.saving == {"cpu": 1 - 18 / 38, "gpu": 1 - 4 / 12}
    assert s.target == {"act_avg": 4.0, "step_avg_s": 10.0}
    assert s.achieved == {"act_avg": 4.0, "step_avg_s": 10.0}
    # every run: ours (tangram), seed 0, workload "?", no config, sized by the first batch
    assert runs.args == [("tangram", 0, "?", None, ["first"])] * 5
    assert s.as_dict() == {"baseline": "fifo", "scale": 5 / 11,
                           "nodes": {"cpu": [4, 8], "gpu": [1, 3]},
                           "saving": {"cpu": 1 - 18 / 38, "gpu": 1 - 4 / 12},
                           "target": {"act_avg": 4.0, "step_avg_s": 10.0},
                           "achieved": {"act_avg": 4.0, "step_avg_s": 10.0},
                           "tried": [[1.0, 2.0, 10.0], [0.5, 4.0, 10.0], [0.25, 8.0, 10.0],
                                     [0.375, 16.0 / 3, 10.0], [0.4375, 4.0, 10.0]]}


def test_savings_needs_the_step_too_and_passes_its_arguments(monkeypatch) -> None:
    runs = _Runs(step=lambda g: 30.0 / g)
    monkeypatch.setattr(runner, "run_policy", runs)
    cfg = SimConfig(train_s=1.0)
    s = savings(_two_pools(), lambda: [["first"]], _rep(4.0, step=15.0, policy="fifo"),
                ours="fifo", seed=3, workload="w", config=cfg, iterations=4)
    # 1.0 (8, 3): ACT 2, step 10, ok; 0.5 (4, 2): 4 and 15, both at the target, ok; 0.25 (2, 1):
    # no; 0.375 (3, 1): no; 0.4375 (4, 1): ACT 4 but step 30 > 15, no
    assert runs.calls == [(8, 3), (4, 2), (2, 1), (3, 1), (4, 1)]
    assert s.scale == 6 / 11 and s.nodes == {"cpu": (4, 8), "gpu": (2, 3)}
    assert s.saving == {"cpu": 1 - 20 / 38, "gpu": 1 - 8 / 12}
    assert s.achieved == {"act_avg": 4.0, "step_avg_s": 15.0}
    assert runs.args == [("fifo", 3, "w", cfg, ["first"])] * 5


def test_savings_within_a_billionth_is_a_match_and_a_stalled_run_never_is(monkeypatch) -> None:
    # ours' ACT on 4 CPU nodes is 4.0: a target of 4 / (1 + 1e-10) still matches
    runs = _Runs(stalled=lambda c, g: c == 2)
    monkeypatch.setattr(runner, "run_policy", runs)
    s = savings(_two_pools(), lambda: [["first"]], _rep(4.0 / (1 + 1e-10), step=10.0 / (1 + 1e-10)),
                iterations=2)
    assert runs.calls == [(8, 3), (4, 2), (2, 1)] and s.scale == 6 / 11
    # a target of 8 s: the quarter (2 CPU nodes, ACT 8) would match, but its run stalled
    runs = _Runs(stalled=lambda c, g: c == 2)
    monkeypatch.setattr(runner, "run_policy", runs)
    s = savings(_two_pools(), lambda: [["first"]], _rep(8.0, step=10.0), iterations=2)
    assert runs.calls == [(8, 3), (4, 2), (2, 1)] and s.scale == 6 / 11


def test_savings_not_matched_on_the_full_cluster_saves_nothing(monkeypatch) -> None:
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    s = savings(_two_pools(), lambda: [["first"]], _rep(1.0, step=10.0, policy="fifo"))
    assert runs.calls == [(8, 3)]  # ACT 2 > 1 on the full cluster: no search
    assert s == Savings("fifo", None, {"cpu": (8, 8), "gpu": (3, 3)}, {"cpu": 0.0, "gpu": 0.0},
                        {"act_avg": 1.0, "step_avg_s": 10.0}, {"act_avg": 2.0, "step_avg_s": 10.0},
                        ((1.0, 2.0, 10.0),))
    # a stalled run on the full cluster is no match however fast
    runs = _Runs(stalled=lambda c, g: True)
    monkeypatch.setattr(runner, "run_policy", runs)
    s = savings(_two_pools(), lambda: [["first"]], _rep(100.0, step=100.0, policy="fifo"))
    assert runs.calls == [(8, 3)] and s.scale is None and s.saving == {"cpu": 0.0, "gpu": 0.0}


def test_savings_of_a_cpu_only_cluster_reports_cpu_only(monkeypatch) -> None:
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    cl = ClusterSpec(tuple(NodeSpec(f"c{i}", Resources(cpu=1, memory_mb=1), pool="cpu")
                           for i in range(8)))
    s = savings(cl, lambda: [], _rep(16.0, step=10.0), iterations=1)
    assert runs.calls == [(8, 0), (4, 0)]
    assert runs.args[0][4] == []  # an empty replay: sized by no trajectory
    assert s.scale == 0.5 and s.nodes == {"cpu": (4, 8)} and s.saving == {"cpu": 0.5}


def test_savings_halves_seven_times_by_default(monkeypatch) -> None:
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    cl = ClusterSpec(tuple(NodeSpec(f"c{i}", Resources(cpu=1, memory_mb=1), pool="cpu")
                           for i in range(1000)))
    # ACT 16 / c against a target of 0.048: ours matches from 334 nodes up; the 7 halvings stop
    # at 336 (a quarter of a percent above), an 8th would try 332
    s = savings(cl, lambda: [], _rep(0.048, step=10.0))
    assert [c for c, _g in runs.calls] == [1000, 500, 250, 375, 312, 344, 328, 336]
    assert s.scale == 0.336 and s.nodes == {"cpu": (336, 1000)}
    assert s.saving == {"cpu": pytest.approx(0.664)}


def test_savings_matched_on_the_full_cluster_only_keeps_it_whole(monkeypatch) -> None:
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    s = savings(_two_pools(), lambda: [["first"]], _rep(2.0, step=10.0, policy="fifo"),
                iterations=2)
    # the half (4 CPU nodes, 2 GPU nodes), then three quarters (6, round(2.25) = 2): ACT 4 and
    # 2.67 > 2
    assert runs.calls == [(8, 3), (4, 2), (6, 2)]
    assert s.scale == 1.0 and s.nodes == {"cpu": (8, 8), "gpu": (3, 3)}
    assert s.saving == {"cpu": 0.0, "gpu": 0.0}
    # a cluster of one 1-core node: it is all the cluster there is (a one-core CPU is reported)
    runs = _Runs()
    monkeypatch.setattr(runner, "run_policy", runs)
    one = ClusterSpec((NodeSpec("c0", Resources(cpu=1, memory_mb=1), pool="cpu"),))
    s = savings(one, lambda: [], _rep(16.0, step=10.0), iterations=3)
    assert runs.calls == [(1, 0)]  # every smaller scale keeps the one node: run once
    assert s.scale == 1.0 and s.nodes == {"cpu": (1, 1)} and s.saving == {"cpu": 0.0}


def test_savings_at_exactly_the_target_plus_a_billionth_is_a_match(monkeypatch) -> None:
    # ours on 4 CPU nodes and 2 GPU nodes answers the target x (1 + 1e-9) to the last bit
    target_act, target_step = 4.0 / 3, 10.0 / 3
    acts = {8: 1.0, 4: target_act * (1 + 1e-9), 2: 99.0}
    steps = {3: 1.0, 2: target_step * (1 + 1e-9), 1: 99.0}
    runs = _Runs(step=lambda g: steps[g])
    monkeypatch.setattr(runner, "run_policy", runs)
    real = runs.__call__

    def call(cluster: ClusterSpec, batches: Any, policy: str, **kw: Any) -> Any:
        r = real(cluster, batches, policy, **kw)
        r.act = {"avg": acts[runs.calls[-1][0]]}
        return r

    monkeypatch.setattr(runner, "run_policy", call)
    s = savings(_two_pools(), lambda: [["first"]], _rep(target_act, step=target_step),
                iterations=2)
    assert runs.calls == [(8, 3), (4, 2), (2, 1)] and s.scale == 6 / 11


# ---- the sizing of the static baselines ---------------------------------------------------------------


def _act(work: float, cpu: float, *, el: tuple[float, float, float] | None = None,
         model: str | None = None) -> SimAction:
    from arl_tangram.core.actions import Elasticity, Speedup

    e = None if el is None else Elasticity(min=el[0], max=el[1],
                                           speedup=Speedup(parallel_fraction=el[2]))
    return SimAction(ActionKind.CODE if model is None else ActionKind.REWARD, work,
                     Resources(cpu=cpu, memory_mb=256), elasticity=e, model=model)


def test_a_task_share_is_its_peak_of_cpu_demand_on_the_closed_loop_replay() -> None:
    a = [
        # from its start at 2: generation 1 s, 3 s on 1 core [3, 6); a model action (no time
        # here) after 0.5 s; 0.5 s later 1 s on 2 cores [7, 8)
        Trajectory("A", "a", ((1.0, _act(3.0, 1)), (0.5, _act(5.0, 0, model="rm")),
                              (0.5, _act(1.0, 2))), start=2.0),
        # at 6.5, 2 s of fully parallel work at its minimum of 2 cores: 1 s, [6.5, 7.5)
        Trajectory("B", "a", ((6.5, _act(2.0, 2, el=(2.0, 4.0, 1.0))),)),
        # at 7.6, 0.1 s on 4 cores: with A's 2, a peak of 6 (B has ended)
        Trajectory("E", "a", ((7.6, _act(0.1, 4)),)),
    ]
    b = [
        # an elastic action whose minimum is half a core runs at half speed: 1 s of work takes
        # 2 s, [0, 2), and overlaps D's [1.5, 2.5): 0.5 + 1
        Trajectory("C", "b", ((0.0, _act(1.0, 0.5, el=(0.5, 2.0, 1.0))),)),
        Trajectory("D", "b", ((1.5, _act(1.0, 1)),)),
    ]
    assert runner.measured_task_shares(a + b, _cluster()) == {"a": 6.0, "b": 1.5}
    # a batch with no CPU action at all: every task an equal share of 1
    judges = [Trajectory("j", "j", ((0.0, _act(1.0, 1, model="rm")),)),
              Trajectory("k", "k", ((0.0, _act(1.0, 0)),))]
    assert runner.measured_task_shares(judges, _cluster()) == {"j": 1.0, "k": 1.0}


def test_what_the_static_policies_hold_for_their_live_trajectories() -> None:
    cl = ClusterSpec((NodeSpec("n0", Resources(cpu=6, memory_mb=8192)),
                      NodeSpec("n1", Resources(cpu=2, memory_mb=8192))))  # 8 cores
    code = [Trajectory(f"c{i}", "a", ((0.0, _act(1.0, 1)),)) for i in range(5)]
    judge = Trajectory("j", "b", ((0.0, _act(1.0, 1, model="rm")),))
    tb = runner._reserved("trajectory-bound", cl, 4, {})
    assert tb is not None
    # a slice of 8 / 4 cores per live trajectory with CPU work; the judge-only one holds none
    assert tb([*code[:2], judge]) == {"cpu": 4.0}
    assert tb(code) == {"cpu": 8.0}  # never more than the cluster
    assert tb([]) == {"cpu": 0.0}
    ti = runner._reserved("task-isolated", cl, 4, {"a": 3.0, "b": 1.0})
    assert ti is not None
    # each task with a live trajectory holds its pool: 3 / 4 and 1 / 4 of the 8 cores
    assert ti(code[:1]) == {"cpu": 6.0}
    assert ti([*code, judge]) == {"cpu": 8.0}
    assert ti([judge]) == {"cpu": 2.0}
    assert ti([Trajectory("x", "c", ())]) == {"cpu": 0.0}  # a task with no measured share
    none = runner._reserved("task-isolated", cl, 4, {})
    assert none is not None and none(code) == {"cpu": 0.0}
    for policy in ("tangram", "fifo", "static-pool"):
        assert runner._reserved(policy, cl, 4, {}) is None


def test_make_core_configures_the_run_it_is_named_for() -> None:
    cfg = runner.make_core(_cluster(), "static-pool:4", 0, {"a": 2.0}, warm_keys=("py",)).st.config
    assert (cfg.policy, cfg.trajectories, cfg.task_shares, cfg.static_k, cfg.warm_keys) == (
        "static-pool", 1, {"a": 2.0}, 4.0, ("py",))
    cfg = runner.make_core(_cluster(), "static-pool", 3, {}).st.config
    assert (cfg.policy, cfg.trajectories, cfg.task_shares, cfg.static_k) == (
        "static-pool", 3, None, None)
    cfg = runner.make_core(_cluster(), "trajectory-bound", 5, None, static_k=2.0).st.config
    assert (cfg.policy, cfg.trajectories, cfg.task_shares, cfg.static_k) == (
        "trajectory-bound", 5, None, 2.0)


_KNOWN = ("tangram, trajectory-bound, task-isolated, fifo, static-pool:1, static-pool:2, "
          "static-pool:4, static-pool:8, static-pool:max")


def test_the_policy_labels_and_their_errors_word_for_word() -> None:
    assert runner.policies() == ("tangram", "trajectory-bound", "task-isolated", "fifo",
                                 "static-pool:1", "static-pool:2", "static-pool:4",
                                 "static-pool:8", "static-pool:max")
    assert [runner.static_label(k) for k in (1, 2.5, None)] == [
        "static-pool:1", "static-pool:2.5", "static-pool:max"]
    assert runner.parse_policy("fifo") == ("fifo", {})
    assert runner.parse_policy("static-pool") == ("static-pool", {"static_k": None})
    assert runner.parse_policy("static-pool:max") == ("static-pool", {"static_k": None})
    assert runner.parse_policy("static-pool:0.5") == ("static-pool", {"static_k": 0.5})
    for label, msg in (("x", f"unknown policy 'x'; known: {_KNOWN}"),
                       ("fifo:2", f"unknown policy 'fifo:2'; known: {_KNOWN}"),
                       ("static-pool:abc",
                        "policy 'static-pool:abc': the fixed allotment must be a number or 'max'"),
                       ("static-pool:0", "policy 'static-pool:0': the fixed allotment must be > 0"),
                       ("static-pool:nan",
                        "policy 'static-pool:nan': the fixed allotment must be > 0")):
        with pytest.raises(KeyError) as e:
            runner.parse_policy(label)
        assert e.value.args == (msg,)


def test_warm_keys_and_boot_count_one_shot_cpu_actions_by_tag_or_kind() -> None:
    def a(tag: str | None = None, *, kind: ActionKind = ActionKind.CODE, session: str | None = None,
          model: str | None = None) -> SimAction:
        return SimAction(kind, 1.0, Resources(cpu=1, memory_mb=256), tag=tag, session=session,
                         model=model)

    batch = [Trajectory("t0", "x", ((0.0, a("python")), (0.0, a("python")), (0.0, a()))),
             Trajectory("t1", "x", ((0.0, a("python")), (0.0, a(kind=ActionKind.TEST)))),
             Trajectory("t2", "x", ((0.0, a("bash", session="s")),
                                    (0.0, a("judge", kind=ActionKind.JUDGE, model="rm"))))]
    assert runner.warm_keys(batch) == ("code", "python", "test")
    # per key, the trajectories with such an action (t0's two python actions count once)
    assert runner.warm_boot(batch) == {"python": 2, "code": 1, "test": 1}
    assert runner.warm_keys([]) == () and runner.warm_boot([]) == {}


# ---- run_policy ----------------------------------------------------------------------------------------


def _two_batches() -> tuple[list[Trajectory], list[Trajectory]]:
    b1 = [Trajectory("t0", "a", ((1.0, _act(2.0, 1)),)),  # 1 s + 2 s
          Trajectory("t1", "b", ((0.0, _act(1.0, 2)),)),  # 1 s on 2 cores
          Trajectory("j", "c", ((0.0, _act(1.0, 0, model="rm")),))]  # no CPU: no slice, no pool
    b2 = [Trajectory("t2", "a", ((0.5, _act(1.0, 1)),), rl_step=1)]
    return b1, b2


def test_run_policy_sizes_by_the_first_batch_and_runs_every_batch() -> None:
    b1, b2 = _two_batches()
    seen: list[tuple[str, int, dict[str, float], dict[str, Any]]] = []

    def factory(cluster: ClusterSpec, policy: str, n: int, shares: Any, **kw: Any) -> Any:
        seen.append((policy, n, dict(shares), kw))
        return runner.make_core(cluster, policy, n, shares, **kw)

    for policy in ("task-isolated", "tangram"):
        r = runner.run_policy(_cluster(), lambda: [b1, b2], policy, seed=5, workload="w",
                              config=SimConfig(train_s=1.0), core_factory=factory)
        assert (r.policy, r.workload, r.seed, r.actions, r.stalled) == (policy, "w", 5, 4, False)
        # (the judge's action is refused: this cluster serves no model "rm")
        assert dict(r.by_status) == {"rejected": 1, "succeeded": 3}
        # step 1: t0's 3 s + 1 s of training; step 2: t2's 1.5 s + 1 s
        assert r.step_s == (4.0, 2.5)
    # 2 trajectories with CPU work; only task-isolated gets the tasks' peaks (a: 1 core, b: 2)
    assert seen == [("task-isolated", 2, {"a": 1.0, "b": 2.0},
                     {"warm_keys": ("code",), "warm_boot": {"code": 2}}),
                    ("tangram", 2, {}, {"warm_keys": ("code",), "warm_boot": {"code": 2}})]
    seen.clear()
    # sized by shares_from, run on the replay: defaults seed 0, workload "?", no training
    r = runner.run_policy(_cluster(), lambda: [b2], "task-isolated", shares_from=b1,
                          core_factory=factory)
    assert (r.workload, r.seed, r.actions, r.step_s) == ("?", 0, 1, (1.5,))
    assert seen == [("task-isolated", 2, {"a": 1.0, "b": 2.0},
                     {"warm_keys": ("code",), "warm_boot": {"code": 2}})]
    seen.clear()
    # no trajectory with CPU work: one slice all the same
    runner.run_policy(_cluster(), lambda: [b1[2:]], "trajectory-bound", core_factory=factory)
    assert seen == [("trajectory-bound", 1, {}, {"warm_keys": (), "warm_boot": {}})]


def test_run_policy_of_an_empty_replay_and_of_a_bad_label() -> None:
    r = runner.run_policy(_cluster(), lambda: [], "task-isolated")
    assert (r.actions, r.step_s, r.stalled) == (0, (), False)

    def never() -> Any:
        raise AssertionError("sampled before the label was checked")

    with pytest.raises(KeyError, match="unknown policy 'nope'"):
        runner.run_policy(_cluster(), never, "nope")


def test_the_static_policies_hold_their_slices_and_pools_idle() -> None:
    # one 2 s action on 1 of 4 cores from 1 s to 3 s: trajectory-bound's one slice and
    # task-isolated's one pool are the whole 4 cores, 3 of them held idle over the 2 s
    for policy, idle in (("trajectory-bound", 0.75), ("task-isolated", 0.75), ("tangram", 0.0)):
        r = runner.run_policy(_cluster(), lambda: [_one_action()], policy)
        assert r.makespan_s == 2.0 and r.utilization["cpu"] == 0.25
        assert r.held_idle["cpu"] == idle, policy


def test_the_collector_is_off_while_a_run_is_set_up_unless_told_otherwise() -> None:
    import gc

    on: list[bool] = []

    def factory(*args: Any, **kw: Any) -> Any:
        on.append(gc.isenabled())
        return runner.make_core(*args, **kw)

    assert gc.isenabled()
    runner.run_policy(_cluster(), lambda: [_one_action()], "tangram", core_factory=factory)
    runner.run_policy(_cluster(), lambda: [_one_action()], "tangram", core_factory=factory,
                      config=SimConfig(gc_tuning=False))
    assert on == [False, True] and gc.isenabled()
