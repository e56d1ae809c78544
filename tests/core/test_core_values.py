"""Exact values of the core's own bookkeeping (core/core.py; issue 43's mutation check): use-based
admission (`_charge`, `_learn_use`), static-pool's fixed width (`_at_fixed`), the history and
counters, rejection reasons (`_impossible`), finish statuses and notes, hand-computed."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, elastic, starts

from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status, WorkHints
from arl_tangram.core.resources import Resources

S = Status


def _short(aid: str):
    return act(aid, hints=WorkHints(expected_s=0.05))


def _measured(d: Driver, uses: list[float]) -> None:
    """One finished short action per use (cores: cpu_s over a 1 s run)."""
    for i, u in enumerate(uses):
        aid = f"m{len(d.core.history)}-{i}"
        d.arrive(_short(aid))
        d.finish(aid, run_s=1.0, cpu_s=u)


@pytest.mark.parametrize(
    ("use", "charged"),
    [
        (0.2, 0.25),  # x1.25 = 0.25: 1/4 of the demand
        (0.01, 0.125),  # at the floor: 1/8
        (0.3, 0.5),  # 0.375 -> 1/2
        (0.4, 0.5),  # exactly 1/2
        (0.79, 1.0),  # 0.9875 -> below 1, rounds to 1: no charge
        (0.8, 1.0),  # 1.0: no charge
    ],
)
def test_a_short_action_is_charged_its_measured_use_over_a_power_of_two(use, charged) -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [use] * 4)
    assert d.core._use_mean == {"code": pytest.approx(use)}
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=4)))  # (keeps "a" queued)
    d.arrive(_short("a"))
    rec = d.core.actions["a"]
    assert rec.cpu == charged
    if charged < 1.0:
        assert rec.charge == Resources(cpu=charged, memory_mb=256)
        assert rec.shape == (("cpu", charged), ("memory_mb", 256.0))
    else:
        assert rec.charge is None
        assert rec.shape == (("cpu", 1.0), ("memory_mb", 256.0))


def test_the_charge_needs_four_samples_and_keeps_the_last_32() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 3)
    assert d.core._use_mean == {}
    d.arrive(_short("three"))
    assert d.core.actions["three"].cpu == 1.0 and d.core.actions["three"].charge is None
    d.finish("three", run_s=1.0, cpu_s=0.2)  # the fourth sample
    assert d.core._use_mean == {"code": pytest.approx(0.2)}
    # a first sample of 20 cores, then 32 of 0.16: only the last 32 count
    e = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(e, [20.0] + [0.16] * 32)
    assert e.core._use_samples["code"] == [pytest.approx(0.16)] * 32
    assert e.core._use_mean["code"] == pytest.approx(0.16)
    e.arrive(_short("a"))
    assert e.core.actions["a"].cpu == 0.25  # 0.2 -> 1/4


def test_use_is_cpu_seconds_over_run_seconds_and_only_successes_count() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    for i in range(4):
        d.arrive(_short(f"w{i}"))
        d.finish(f"w{i}", run_s=0.5, cpu_s=0.05)  # 0.1 core
    d.arrive(_short("f"))
    d.finish("f", status=S.FAILED, run_s=0.5, cpu_s=5.0)  # a failure teaches nothing
    d.arrive(_short("z"))
    d.finish("z", run_s=0.0, cpu_s=5.0)  # no run time: nothing
    assert d.core._use_samples == {"code": [pytest.approx(0.1)] * 4}


def test_only_short_rigid_one_shot_cpu_actions_are_charged_by_use() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 4)
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=4)))
    # (the runs taught 1 s per 0.05 expected: "edge" is estimated at exactly short_action_s)
    d.arrive(act("long", hints=WorkHints(expected_s=0.06)))  # 1.2 s: longer
    d.arrive(act("edge", hints=WorkHints(expected_s=0.05)))
    assert (d.core.actions["long"].est, d.core.actions["edge"].est) == (pytest.approx(1.2), 1.0)
    d.arrive(act("zero", cpu=0, hints=WorkHints(expected_s=0.05)))
    a = d.core.actions
    assert a["long"].cpu == 1.0 and a["long"].charge is None
    assert a["edge"].cpu == 0.25
    assert a["zero"].charge is None
    # a policy that does not admit by use
    f = Driver([cpu_node("n0", cpu=4)], policy="static-pool", short_action_s=1.0)
    _measured(f, [0.2] * 4)
    assert f.core._use_samples == {}
    z = Driver([cpu_node("n0", cpu=4)], policy="tangram")  # short_action_s 0: none
    _measured(z, [0.2] * 4)
    assert z.core._use_samples == {}


@pytest.mark.parametrize(
    ("static_k", "cap", "width"),
    [(2.0, 8, 2.0), (None, 3, 3.0), (0.5, 8, 1.0), (10.0, 2, 2.0), (None, 8, 4.0), (3.0, 8, 3.0)],
)
def test_static_pool_runs_an_elastic_action_at_its_fixed_width(static_k, cap, width) -> None:
    d = Driver([cpu_node("n0", cpu=cap)], policy="static-pool", static_k=static_k)
    s = starts(d.arrive(elastic("e", lo=1, hi=4)))
    assert s["e"].allotment == Resources(cpu=width, memory_mb=256)
    el = d.core.actions["e"].spec.elasticity
    assert (el.min, el.max, el.dim) == (width, width, "cpu")
    assert el.speedup.parallel_fraction == 0.9
    assert type(el.min) is float


def test_the_history_keeps_the_newest_and_the_counters_count() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", history=2)
    for aid in ("a", "b", "c"):
        d.arrive(act(aid))
        d.finish(aid)
    d.arrive(act("x", cpu=9))  # rejected at once
    assert list(d.core.history) == ["c", "x"]
    assert d.core.status("a") is None and d.core.story("a") == []
    assert d.core.status("c") is S.SUCCEEDED and d.core.status("x") is S.REJECTED
    assert d.core.story("c")[-1] == "t=0 STARTING->SUCCEEDED (cause ActionFinished:c)"
    assert (d.core.arrived, d.core.delivered) == (4, 4)
    assert d.core.terminal == {S.SUCCEEDED: 3, S.REJECTED: 1}
    assert d.core.seq == 4
    d.arrive(act("a"))  # an id delivered before arrives again: a new action
    assert d.core.status("a") is S.STARTING and d.core.actions["a"].seq == 5


def test_a_duplicate_arrival_is_noted_and_ignored() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("a"))
    out = d.arrive(act("a", cpu=2))
    assert out == []
    assert d.core.arrived == 1 and d.core.seq == 1
    assert d.core.actions["a"].spec.demand == Resources(cpu=1, memory_mb=256)
    assert d.core.story("a")[-1] == "t=0 duplicate arrival ignored (cause a)"


def test_rejection_reasons() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d.arrive(act("big", cpu=3))
    r = d.result("big")
    assert r.status is S.REJECTED
    assert r.reason == (
        "no node can ever satisfy demand Resources(cpu=3, memory_mb=256) "
        "(largest capacities {'cpu': 2.0, 'memory_mb': 8192.0})"
    )
    # a session's first action: the session's own demand is added
    d.arrive(act("s2", cpu=2, mem=8000, session="q"))
    assert d.result("s2").reason == (
        "no node can ever satisfy demand Resources(cpu=2, memory_mb=8256) "
        "(largest capacities {'cpu': 2.0, 'memory_mb': 8192.0})"
    )
    d.arrive(act("s3", cpu=2, mem=7936, session="q2"))  # 7936 + 256 = 8192: fits
    assert "s3" not in d.delivered
    # an open session: what its node can offer besides what the session holds
    d = Driver([cpu_node("n0", cpu=2)], policy="tangram")
    d(ev.SessionRequested(0.0, "z", demand=Resources(cpu=1, memory_mb=256)))
    d.arrive(act("z1", cpu=2, session="z"))
    assert d.result("z1").status is S.REJECTED
    assert d.result("z1").reason == (
        "demand Resources(cpu=2, memory_mb=256) exceeds what session "
        "z's node n0 can offer: short {'cpu': 1.0}"
    )
    d.arrive(act("z2", cpu=1, mem=8192 - 256, session="z"))  # exactly what is left
    assert "z2" not in d.delivered


def test_finish_statuses_and_notes() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("a"), act("b"), act("c"), act("t"))
    d.finish("a", status=S.RUNNING)
    assert d.result("a").status is S.FAILED
    assert d.result("a").reason == "executor reported non-terminal status RUNNING"
    d.finish("b", status=S.REJECTED)
    assert d.result("b").status is S.FAILED and d.result("b").reason == ""
    d.finish("t", status=S.TIMED_OUT, reason="slow")
    assert d.result("t").status is S.TIMED_OUT and d.result("t").reason == "slow"
    d.at(1.0)(ev.ActionStarted(1.0, "c", "n0", cold_start_s=1.234))
    assert d.core.status("c") is S.RUNNING
    assert d.core.story("c")[-2:] == [
        "t=1 STARTING->RUNNING (cause ActionStarted:c)",
        "t=1 cold start 1.23s (cause ActionStarted:c)",
    ]
    assert d.core.actions["c"].start_time == 1.0
    d.at(3.5).finish("c")
    r = d.result("c")
    assert (r.submit_time, r.start_time, r.finish_time) == (0.0, 1.0, 3.5)
    d(ev.ActionStarted(4.0, "c", "n0"))  # stale: ignored
    assert d.core.status("c") is S.SUCCEEDED


def test_a_lost_node_requeues_idempotent_actions_and_loses_the_rest() -> None:
    from core_helpers import cpu_commands

    d = Driver([cpu_node("n0", cpu=3), cpu_node("n1", cpu=1)], policy="tangram")
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256), node="n0"))
    out = d.arrive(
        act("i", idempotent=True),
        act("o", idempotent=False),
        act("q", cpu=1, session="s"),
        act("w", cpu=1),
        act("x", cpu=1, session="s"),
    )
    assert cpu_commands(out) == [
        ("start", "i", 1.0),
        ("start", "o", 1.0),
        ("start", "q", 1.0),
        ("start", "w", 1.0),
    ]
    assert cpu_commands(d.at(1.0)(ev.NodeLost(1.0, "n0", reason="gone"))) == []
    assert {k: r.status for k, r in d.core.actions.items()} == {"i": S.QUEUED, "w": S.STARTING}
    assert d.core.story("i")[-2:] == [
        "t=1 STARTING->QUEUED (cause NodeLost:n0)",
        "t=1 requeued: node n0 lost: gone (cause NodeLost:n0)",
    ]
    for aid in ("o", "q"):  # running there: lost, as they ran
        r = d.result(aid)
        assert (r.status, r.reason, r.node) == (S.NODE_LOST, "node n0 lost: gone", "n0")
        assert r.allotment == Resources(cpu=1, memory_mb=256) and r.finish_time == 1.0
    r = d.result("x")  # queued in the session: lost with it
    assert (r.status, r.reason, r.node) == (
        S.NODE_LOST,
        "session s closed: node n0 lost: gone",
        None,
    )
    n0 = d.core.nodes["n0"]
    assert (n0.alive, n0.running, n0.elastic, d.core.st.sessions) == (False, set(), {}, {})
    assert d.at(2.0)(ev.NodeLost(2.0, "n0", reason="again")) == []  # (already lost)
    assert d.core.terminal == {S.NODE_LOST: 3}
    out = d.at(2.0)(ev.NodeAdded(2.0, cpu_node("n0", cpu=3)))
    assert cpu_commands(out) == [("start", "i", 1.0)]
    assert d.core.actions["i"].attempts == 2
    assert d.at(2.5)(ev.NodeAdded(2.5, cpu_node("n0", cpu=5))) == []  # (alive: ignored)
    assert d.core.nodes["n0"].cap["cpu"] == 3.0


def test_a_cancel_stops_a_running_action_on_its_node_and_a_queued_one_in_place() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d.arrive(act("a"), act("b"), act("c"))
    out = d.at(0.5)(ev.CancelRequested(0.5, "c"))  # queued: no CancelAction
    assert [type(c).__name__ for c in out] == ["Deliver"]
    assert d.result("c").status is S.CANCELLED and d.result("c").reason == "cancelled by request"
    out = d(ev.CancelRequested(0.5, "a"))
    assert out[0] == cmd.CancelAction("a", "n0", cause="CancelRequested:a")
    r = d.result("a")
    assert (r.status, r.reason, r.start_time, r.finish_time, r.node) == (
        S.CANCELLED,
        "cancelled by request",
        0.0,
        0.5,
        "n0",
    )
    assert list(starts(out)) == ["b"]  # its core went back to the node
    assert d(ev.CancelRequested(0.6, "nobody")) == []
    assert d.core.terminal == {S.CANCELLED: 2}


def test_closing_a_session_cancels_its_queued_actions() -> None:
    from arl_tangram.core import commands as cmd

    d = Driver([cpu_node("n0", cpu=1)], policy="tangram")
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    d.arrive(act("r", session="s"), act("q", session="s"))
    out = d.at(1.0)(ev.SessionClosed(1.0, "s"))
    assert out[0] == cmd.CloseSession("s", "n0", "closed by client", cause="SessionClosed:s")
    r = d.result("q")
    assert (r.status, r.reason) == (S.CANCELLED, "session s closed: closed by client")
    assert d.core.status("r") is S.STARTING  # (running: it ends on its own)
    d(ev.SessionRequested(1.0, "t", demand=Resources(memory_mb=256)))
    d.arrive(act("u", session="t", cpu=0.5))
    d.at(2.0)(ev.SessionClosed(2.0, "t", reason="bye"))
    assert d.result("u").reason == "session t closed: bye"
    assert d(ev.SessionClosed(3.0, "t")) == []  # (closed already)


def _one_rm_driver() -> Driver:
    """One GPU node and one reward model "rm" (one instance, batches of 16, a 10 s load), not
    prewarmed."""
    from core_helpers import gpu_node

    from arl_tangram.core.cluster import ModelSpec

    rm = ModelSpec(
        "rm",
        memory_mb=8000,
        alpha=0.04,
        beta=0.01,
        max_batch=16,
        max_instances=1,
        load_s=10.0,
        swap_s=1.0,
    )
    return Driver([gpu_node("g0", gpus=1)], [rm], policy="tangram", model_prewarm=False)


def test_a_batch_lost_with_its_instance_runs_again_once_then_fails() -> None:
    from core_helpers import of, reward

    from arl_tangram.core import commands as cmd

    d = _one_rm_driver()
    (ld,) = of(d.arrive(reward("a")), cmd.LoadModel)
    of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    out = d(ev.ModelUnloaded(2.0, ld.instance_id, False, ""))
    rec = d.core.actions["a"]
    assert (rec.status, rec.batch, rec.attempts) == (S.QUEUED, None, 1)
    assert d.core.story("a")[-2:] == [
        "t=2 RUNNING->QUEUED (cause ModelUnloaded:rm#1)",
        "t=2 requeued: model instance rm#1 was unloaded mid-batch (cause ModelUnloaded:rm#1)",
    ]
    (ld2,) = of(out, cmd.LoadModel)
    of(d(ev.ModelLoaded(3.0, ld2.instance_id)), cmd.RunBatch)
    d(ev.ModelUnloaded(4.0, ld2.instance_id, False, ""))
    r = d.result("a")
    assert (r.status, r.attempts) == (S.FAILED, 2)
    assert r.reason == "model instance rm#2 was unloaded mid-batch (tried 2 times)"


def test_reports_for_unknown_or_lost_nodes_and_a_batch_of_unknown_actions_are_ignored() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy="tangram")
    assert d(ev.WarmPoolReport(0.0, "zz", "python", 3)) == []
    d(ev.NodeLost(0.0, "n1"))
    assert d(ev.WarmPoolReport(0.0, "n1", "python", 3)) == []
    assert d.core.nodes["n1"].warm.get("python", 0) == 0
    d(ev.WarmPoolReport(0.0, "n0", "python", 3))
    assert d.core.nodes["n0"].warm == {"python": 3}


# ---- providers (the core's side) ------------------------------------------------------------


def _search(aid: str, provider: str = "p", **kw):
    from arl_tangram.core.actions import ActionKind, ActionSpec

    return ActionSpec(
        aid, kind=ActionKind.SEARCH, tag=provider, demand=Resources(), payload={"query": aid}, **kw
    )


def _prov(**lim) -> Driver:
    from arl_tangram.core.providers import ProviderLimits

    return Driver([cpu_node("n0")], providers=(ProviderLimits(name="p", **lim),))


def test_a_throttled_call_notes_the_wait_and_fails_past_its_attempts() -> None:
    d = _prov(rate=100.0, burst=5.0, max_attempts=3)
    d.arrive(_search("q"))
    d.at(0.1)(ev.ProviderThrottled(0.1, "q", retry_after_s=1.5))
    assert d.core.status("q") is S.QUEUED
    assert d.core.story("q")[-2:] == [
        "t=0.1 STARTING->QUEUED (cause ProviderThrottled:q)",
        "t=0.1 throttled by p (429, Retry-After 1.5s): waits again (cause ProviderThrottled:q)",
    ]
    d.at(2.0)(ev.Wake(2.0))
    d.at(2.1)(ev.ProviderThrottled(2.1, "q"))
    assert d.core.story("q")[-1] == (
        "t=2.1 throttled by p (429): waits again (cause ProviderThrottled:q)"
    )
    d.at(3.0)(ev.Wake(3.0))
    assert (d.core.status("q"), d.core.actions["q"].attempts) == (S.STARTING, 3)
    d.at(3.1)(ev.ProviderThrottled(3.1, "q"))
    assert d.result("q").reason == "provider 'p': answered 429 to 3 attempts"
    assert d.result("q").status is S.FAILED
    # a 429 for a call already ended: its slot is all that is left
    d.arrive(_search("r"))
    d.at(3.2)(ev.CancelRequested(3.2, "r"))
    assert d.at(3.3)(ev.ProviderThrottled(3.3, "r")) == []
    assert "r" not in d.core.providers.owner


def test_a_provider_call_teaches_the_estimator_its_run_time() -> None:
    from arl_tangram.core.estimator import DurationEstimator

    d = _prov(rate=100.0, burst=5.0)
    d.at(0.5).arrive(_search("r"))
    assert d.core.actions["r"].start_time == 0.5
    key, units = d.core.estimator.work_of(d.core.actions["r"].spec)
    d.at(4.0).finish("r", run_s=None)  # 3.5 s since it left
    ref = DurationEstimator()
    ref.observe_work(key, units, 3.5, 1.0)
    q = d.core.config.estimate_quantile
    assert d.core.estimator.predict_work(key, units, q) == ref.predict_work(key, units, q)
    assert d.result("r").status is S.SUCCEEDED
    # a failure teaches nothing; a rejected or non-terminal report is a failure
    d.at(4.0).arrive(_search("f"), _search("g"), _search("h"))
    d.at(9.0).finish("f", status=S.FAILED)
    assert d.core.estimator.predict_work(key, units, q) == ref.predict_work(key, units, q)
    d.at(9.0).finish("g", status=S.REJECTED)
    d.at(9.0).finish("h", status=S.RUNNING)
    assert (d.result("g").status, d.result("h").status) == (S.FAILED, S.FAILED)


def test_provider_arrivals_rejected_answered_from_cache_and_coalesced_in_their_stories() -> None:
    d = _prov(rate=100.0, burst=5.0)
    d.at(1.0).arrive(_search("u", provider=None))
    assert d.result("u").reason == "unknown provider '' (providers: p)"
    assert d.core.story("u") == ["t=1 arrived (cause u)", "t=1 PENDING->REJECTED (cause u)"]
    from arl_tangram.core.actions import ActionKind, ActionSpec

    def s(aid: str, **payload):
        return ActionSpec(
            aid,
            kind=ActionKind.SEARCH,
            tag="p",
            demand=Resources(),
            payload={"query": aid, **payload},
        )

    d.arrive(s("c", cached={"x": 1}))
    r = d.result("c")
    assert (r.status, r.output, r.start_time, r.attempts) == (S.SUCCEEDED, {"x": 1}, None, 0)
    assert d.core.story("c") == [
        "t=1 arrived (cause c)",
        "t=1 PENDING->QUEUED (cause c)",
        "t=1 QUEUED->SUCCEEDED (cause c)",
    ]
    d.arrive(s("c2", cached=[]))  # (an empty answer is an answer)
    assert d.core.providers.by_name["p"].cache_hits == 2
    d.arrive(s("a", coalesce="k"), s("b", coalesce="k"), s("z", coalesce=""))
    assert d.core.story("b")[-1] == "t=1 coalesced with a (cause b)"
    assert d.core.providers.follows == {"b": "a"}  # ("" coalesces nothing)
    assert d.core.story("a")[1] == "t=1 PENDING->QUEUED (cause a)"


def test_a_spent_budget_fails_the_arrival_in_its_story() -> None:
    d = _prov(rate=100.0, burst=5.0, budget=1)
    d.arrive(_search("a"))
    d.at(0.5).finish("a")  # answered: the budget is spent
    d.at(1.0).arrive(_search("b"))
    r = d.result("b")
    assert (r.status, r.reason) == (S.FAILED, "provider 'p': budget of 1 calls spent (1 answered)")
    assert d.core.story("b") == [
        "t=1 arrived (cause b)",
        "t=1 PENDING->QUEUED (cause b)",
        "t=1 QUEUED->FAILED (cause b)",
    ]


def test_static_pool_clamps_to_the_largest_node_only_where_one_has_cpu() -> None:
    from arl_tangram.core.cluster import NodeSpec

    # no node has CPU: the fixed width stays static_k (its rejection names it)
    none = Driver(
        [NodeSpec("m", Resources(memory_mb=8192), pool="cpu")], policy="static-pool", static_k=3.0
    )
    none.arrive(elastic("e", lo=1, hi=4))
    assert none.result("e").reason.startswith(
        "no node can ever satisfy demand Resources(cpu=3, memory_mb=256) "
    )
    # half a core at most: clamped to it, then to the minimum
    half = Driver(
        [NodeSpec("m", Resources(cpu=0.5, memory_mb=8192), pool="cpu")],
        policy="static-pool",
        static_k=3.0,
    )
    half.arrive(elastic("e", lo=1, hi=4))
    assert half.result("e").reason.startswith(
        "no node can ever satisfy demand Resources(cpu=1, memory_mb=256) "
    )
    d = Driver([cpu_node("n0", cpu=8)], policy="static-pool", static_k=2.0)
    d.arrive(elastic("e", lo=1, hi=4))
    assert d.core.actions["e"].spec.demand == Resources(cpu=2, memory_mb=256)


def test_use_based_charges_skip_sessions_and_elastic_actions_and_scale_with_the_demand() -> None:
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 4)
    d.core.handle(ev.ActionArrived(0.0, act("blocker", cpu=8)))
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    d.arrive(act("in-session", session="s", hints=WorkHints(expected_s=0.05)))
    d.arrive(elastic("el", lo=1, hi=2, hints=WorkHints(expected_s=0.05)))
    d.arrive(act("two", cpu=2, hints=WorkHints(expected_s=0.05)))
    a = d.core.actions
    assert a["in-session"].charge is None and a["in-session"].cpu == 1.0
    assert a["el"].charge is None
    assert a["two"].cpu == 0.25  # 0.2 x 1.25 of 2 cores: 1/8 of the demand (the floor)


def test_cancelling_provider_calls() -> None:
    from arl_tangram.core import commands as cmd

    d = _prov(rate=100.0, burst=1.0, concurrency=1)
    d.arrive(_search("a"), _search("b"), act("c", cpu=4), act("q", cpu=4))
    assert (d.core.status("a"), d.core.status("b")) == (S.STARTING, S.QUEUED)
    assert d.core.status("q") is S.QUEUED
    out = d.at(0.1)(ev.CancelRequested(0.1, "a"))  # in flight: aborted on no node
    assert out[0] == cmd.CancelAction("a", "", cause="CancelRequested:a")
    assert d.result("a").status is S.CANCELLED
    out = d.at(0.1)(ev.CancelRequested(0.1, "q"))  # a queued CPU action: no CancelAction
    assert [type(c).__name__ for c in out] == ["Deliver"]
    d.at(0.2)(ev.Wake(0.2))
    d.arrive(_search("w"))
    assert d.core.status("w") is S.QUEUED
    out = d.at(0.2)(ev.CancelRequested(0.2, "w"))  # a waiting call: nothing to abort
    assert [type(c).__name__ for c in out] == ["Deliver"]


def test_a_lost_node_forgets_its_warm_executors() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy="tangram")
    d(ev.WarmPoolReport(0.0, "n1", "python", 3))
    d(ev.WarmPoolReport(0.0, "n0", "python", 1))
    assert d.core.placer.warm_nodes["python"] == {"n0": None, "n1": None}
    assert d(ev.NodeLost(0.5, "zz")) == []  # (unknown: ignored)
    d(ev.NodeLost(1.0, "n1"))
    assert d.core.nodes["n1"].warm.get("python", 0) == 0
    assert list(d.core.placer.warm_nodes["python"]) == ["n0"]


def test_a_cancelled_leader_hands_its_call_to_the_first_follower() -> None:
    from arl_tangram.core import commands as cmd
    from arl_tangram.core.actions import ActionKind, ActionSpec

    def s(aid: str, **payload):
        return ActionSpec(
            aid,
            kind=ActionKind.SEARCH,
            tag="p",
            demand=Resources(),
            payload={"query": aid, **payload},
        )

    d = _prov(rate=1.0, burst=1.0, concurrency=4)
    d.arrive(s("x"), s("a", coalesce="k"), s("b", coalesce="k"), s("c", coalesce="k"))
    sent = [c for c in d.log if not isinstance(c, cmd.Deliver)]
    assert [(type(c).__name__, c.cause) for c in sent] == [
        ("CallProvider", "ActionArrived:x"),
        ("WakeAt", "ActionArrived:a"),
    ]
    assert sent[1].time == 1.0
    d.at(0.2)(ev.CancelRequested(0.2, "a"))
    assert d.core.story("b")[-1] == (
        "t=0.2 leads the call after a was cancelled (cause CancelRequested:a)"
    )
    assert d.core.providers.follows == {"c": "b"}
    assert d.core.providers.key_of == {"b": ("p", "k")}
    out = d.at(1.0)(ev.Wake(1.0))
    (call,) = [c for c in out if isinstance(c, cmd.CallProvider)]
    assert (call.action.id, call.attempt, call.deadline, call.cause) == ("b", 1, 60.0, "Wake@1")
    assert d.core.story("b")[-1] == "t=1 QUEUED->STARTING (cause Wake@1)"
    d.at(1.5).finish("b", output={"r": 1})
    assert d.result("c").output == {"r": 1} and d.result("c").status is S.SUCCEEDED
    assert d.core.story("c")[-1] == "t=1.5 QUEUED->SUCCEEDED (cause ActionFinished:b)"
    assert d.core.story("b")[-1] == "t=1.5 STARTING->SUCCEEDED (cause ActionFinished:b)"


def test_a_retried_call_keeps_its_first_start_time() -> None:
    d = _prov(rate=100.0, burst=5.0)
    d.at(0.5).arrive(_search("q"))
    d.at(0.6)(ev.ProviderThrottled(0.6, "q"))
    d.at(2.0)(ev.Wake(2.0))
    assert d.core.actions["q"].attempts == 2
    d.at(2.5).finish("q")
    assert (d.result("q").start_time, d.result("q").attempts) == (0.5, 2)


def test_a_batch_without_a_result_for_an_action_fails_it() -> None:
    from core_helpers import of, reward

    from arl_tangram.core import commands as cmd

    d = _one_rm_driver()
    (ld,) = of(d.arrive(reward("a"), reward("b"), reward("c")), cmd.LoadModel)
    (b,) = of(d(ev.ModelLoaded(1.0, ld.instance_id)), cmd.RunBatch)
    d(ev.BatchFinished(2.0, b.batch_id, ld.instance_id, outputs={"a": 1.0}, failed={"b": "boom"}))
    got = {k: (d.result(k).status, d.result(k).reason, d.result(k).output) for k in "abc"}
    assert got == {
        "a": (S.SUCCEEDED, "", 1.0),
        "b": (S.FAILED, "boom", None),
        "c": (S.FAILED, f"no result for it in batch {b.batch_id}", None),
    }


def _learned(d: Driver, aid: str) -> float:
    est = d.core.estimator
    key, units = est.work_of(act(aid, hints=WorkHints(expected_s=0.05)))
    return est.predict_work(key, units, d.core.config.estimate_quantile)


def test_a_finish_without_its_run_time_is_timed_from_its_start() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.at(0.5).arrive(_short("a"))
    d.at(4.0).finish("a", run_s=None)  # 3.5 s since it started
    ref = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    ref.at(0.5).arrive(_short("a"))
    ref.at(9.0).finish("a", run_s=3.5)
    assert _learned(d, "x") == _learned(ref, "x")
    assert _learned(d, "x") != _learned(Driver([cpu_node("n0")], policy="tangram"), "x")


def _observed(d: Driver) -> list[tuple]:
    """The estimator's `observe_work` calls from now on: (key, units, run_s, speed)."""
    est = d.core.estimator
    calls: list[tuple] = []
    orig = est.observe_work

    def rec(*a):
        calls.append(a)
        return orig(*a)

    est.observe_work = rec
    return calls


@pytest.mark.pure_core  # (replaces the estimator's method: the compiled core's are read-only)
def test_a_finished_action_is_observed_at_the_speed_of_the_quota_it_ran_with() -> None:
    """Charged a quarter core, a short action ran with its whole demand's quota (speed 1); an
    elastic one at its width (4 cores at p = 0.9)."""
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram", short_action_s=1.0)
    _measured(d, [0.2] * 4)
    d.arrive(_short("a"))
    assert d.core.actions["a"].charge == Resources(cpu=0.25, memory_mb=256)
    calls = _observed(d)
    d.finish("a", run_s=3.0)
    assert [c[2:] for c in calls] == [(3.0, 1.0)]
    d.arrive(elastic("e", 1, 4, p=0.9, hints=WorkHints(expected_s=10.0)))
    assert d.core.actions["e"].width == 4.0
    d.finish("e", run_s=2.0)
    assert calls[1][2:] == (2.0, pytest.approx(1.0 / (0.1 + 0.9 / 4), rel=1e-12))


@pytest.mark.parametrize(
    "shares, floor, lends",
    [({"a": 2.0, "b": 1.0}, 0.5, True), (None, 0.5, False), ({"a": 2.0, "b": 1.0}, 1.0, False)],
)
def test_lending_is_on_only_with_tenant_shares_and_a_floor_below_one(shares, floor, lends) -> None:
    core = Driver([cpu_node("n0")], tenant_shares=shares, lend_floor=floor).core
    assert (core.lending is not None) is lends
    if lends:
        assert core.lending is core.scheduling.lending
        assert core.lending.st is core.st and core.lending.placer is core.placer
        assert core.lending.floor == 0.5


def test_the_provider_settings_reach_the_providers() -> None:
    from arl_tangram.core.providers import ProviderLimits

    lim = (ProviderLimits(name="p", rate=10.0, burst=2.0),)
    p = Driver([cpu_node("n0")], providers=lim).core.providers
    assert (p.aging_s, p.policy, p.semaphore, p.coalesce, p.trajectories) == (
        30.0,
        "tangram",
        None,
        True,
        1,
    )
    assert p.tenant_weight is None
    core = Driver(
        [cpu_node("n0")],
        providers=lim,
        aging_s=7.0,
        provider_policy="semaphore",
        provider_semaphore=4,
        provider_coalesce=False,
        trajectories=3,
        tenant_shares={"a": 2.0, "b": 1.0},
    ).core
    p = core.providers
    assert (p.aging_s, p.policy, p.semaphore, p.coalesce, p.trajectories) == (
        7.0,
        "semaphore",
        4,
        False,
        3,
    )
    assert p.tenant_weight is not None
    assert (p.tenant_weight("a"), p.tenant_weight("b")) == (2.0, 1.0)
