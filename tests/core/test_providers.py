"""Provider quotas as capacity (issue 37 item 1): the core's part, events in, commands out.

A search/fetch action names its provider in ``tag``; it waits for a token of the provider's
bucket and a slot, in shortest-expected-first order, leaves as `CallProvider`, and the core asks
to be woken (`WakeAt`) when the next token appears. A 429 without headers halves the rate (once
per round), success probes it back up, Retry-After pauses it; a spent budget fails at once.
Exact values: tokens, times, order.
"""

from __future__ import annotations

import math

import pytest
from core_helpers import Driver, cpu_node

from arl_tangram.core import CoreConfig
from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, Status, WorkHints
from arl_tangram.core.providers import Bucket, ProviderLimits
from arl_tangram.core.resources import Resources


def search(aid: str, provider: str = "serper", expected: float | None = None,
           key: str | None = None, timeout: float = 60.0, kind: ActionKind = ActionKind.SEARCH,
           ) -> ActionSpec:
    payload = {"query": aid} if key is None else {"query": key, "coalesce": key}
    return ActionSpec(aid, kind=kind, tag=provider, demand=Resources(),
                      hints=WorkHints(expected_s=expected), timeout_s=timeout, payload=payload)


def driver(*limits: ProviderLimits, **cfg) -> Driver:
    return Driver([cpu_node("n0")], providers=tuple(limits), **cfg)


def calls(out: list[cmd.Command]) -> list[str]:
    return [c.action.id for c in out if isinstance(c, cmd.CallProvider)]


def wakes(out: list[cmd.Command]) -> list[float]:
    return [c.time for c in out if isinstance(c, cmd.WakeAt)]


def test_a_burst_leaves_at_the_bucket_s_pace_and_the_core_asks_to_be_woken_at_each_token() -> None:
    d = driver(ProviderLimits(name="serper", rate=4.0, burst=2.0, concurrency=100))
    out = d.arrive(*(search(f"q{i}") for i in range(5)))
    assert calls(out) == ["q0", "q1"]  # the burst
    assert wakes(out) == [0.25]  # one token per 1/4 s
    out = d.at(0.25)(ev.Wake(0.25))
    assert calls(out) == ["q2"] and wakes(out) == [0.5]
    out = d.at(0.4)(ev.Tick(0.4))  # (no token yet: nothing, and no second WakeAt for 0.5)
    assert calls(out) == [] and wakes(out) == []
    out = d.at(1.0)(ev.Wake(1.0))  # 0.5 s late: two tokens came meanwhile (burst 2)
    assert calls(out) == ["q3", "q4"] and wakes(out) == []
    p = d.core.providers.by_name["serper"]
    assert p.bucket.tokens == pytest.approx(0.0) and p.sent == 5
    c = next(c for c in d.log if isinstance(c, cmd.CallProvider) and c.action.id == "q4")
    assert (c.provider, c.attempt, c.deadline) == ("serper", 1, 60.0)
    assert d.status("q4") is Status.STARTING


def test_the_slot_cap_holds_calls_until_a_report_frees_one() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, concurrency=2))
    out = d.arrive(*(search(f"q{i}", "p") for i in range(4)))
    assert calls(out) == ["q0", "q1"] and wakes(out) == []  # slots, not tokens, hold them
    out = d.at(0.3).finish("q0", run_s=0.3, output={"hits": 1})
    assert calls(out) == ["q2"]
    assert d.result("q0").status is Status.SUCCEEDED and d.result("q0").output == {"hits": 1}
    assert len(d.core.providers.by_name["p"].inflight) == 2


def test_waiting_calls_go_shortest_expected_first_fifo_inside_a_class() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=10))
    d.arrive(search("first", "p", expected=1.0))  # takes the only token
    d.arrive(search("slow", "p", expected=8.0), search("fast", "p", expected=0.5),
             search("fast2", "p", expected=0.5), search("mid", "p", expected=2.0))
    order = []
    for t in (1.0, 2.0, 3.0, 4.0):
        order += calls(d.at(t)(ev.Wake(t)))
    assert order == ["fast", "fast2", "mid", "slow"]


def test_an_old_waiter_ages_ahead_of_shorter_newcomers() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=10), aging_s=2.0,
               aging_min_s=0.5)
    d.arrive(search("a", "p", expected=1.0), search("slow", "p", expected=8.0))
    d.at(0.5).arrive(search("f1", "p", expected=0.5))
    assert calls(d.at(1.0)(ev.Wake(1.0))) == ["f1"]
    d.at(1.5).arrive(search("f2", "p", expected=0.5))
    assert calls(d.at(2.0)(ev.Wake(2.0))) == ["slow"]  # aged at 2.0 (waited 2 s): first


def test_a_429_without_headers_halves_the_rate_once_per_round_and_success_probes_back() -> None:
    lim = ProviderLimits(name="p", rate=10.0, burst=3.0, concurrency=10, probe_per_s=1.0)
    d = driver(lim)
    out = d.arrive(*(search(f"q{i}", "p") for i in range(5)))
    assert calls(out) == ["q0", "q1", "q2"]
    out = d.at(0.05)(ev.ProviderThrottled(0.05, "q0"))
    b = d.core.providers.by_name["p"].bucket
    assert b.rate == 5.0 and b.tokens == 0.0
    assert d.status("q0") is Status.QUEUED
    assert wakes(out) == []  # (the WakeAt(0.1) sent at 0 stands: it comes first)
    out = d.at(0.1)(ev.Wake(0.1))
    assert calls(out) == [] and wakes(out) == [pytest.approx(0.25)]  # 1 token at 5/s
    # q1 was sent before that decrease: its 429 is the same round, no second halving
    d.at(0.11)(ev.ProviderThrottled(0.11, "q1"))
    assert b.rate == 5.0
    out = d.at(0.25)(ev.Wake(0.25))
    assert calls(out) == ["q0"]  # the throttled call kept its place (oldest first)
    c = next(c for c in out if isinstance(c, cmd.CallProvider))
    assert c.attempt == 2
    d.at(0.3)(ev.ProviderThrottled(0.3, "q0"))  # sent after the decrease: a new round
    assert b.rate == 2.5
    d.at(2.3).finish("q2", run_s=0.1)  # 2 s of success since the last change: +2 req/s
    assert b.rate == pytest.approx(4.5)
    p = d.core.providers.by_name["p"]
    assert (p.throttles, p.decreases, p.spent) == (3, 2, 1)


def test_retry_after_pauses_the_bucket_then_one_call_probes() -> None:
    d = driver(ProviderLimits(name="p", rate=10.0, burst=5.0, concurrency=10))
    d.arrive(*(search(f"q{i}", "p") for i in range(5)))
    d.arrive(search("q5", "p"), search("q6", "p"))
    out = d.at(0.1)(ev.ProviderThrottled(0.1, "q0", retry_after_s=2.0))
    assert wakes(out) == [pytest.approx(2.1)]
    b = d.core.providers.by_name["p"].bucket
    assert b.rate == 10.0  # a pause, not a decrease
    assert calls(d.at(1.9)(ev.Tick(1.9))) == []
    out = d.at(2.1)(ev.Wake(2.1))
    assert calls(out) == ["q0"]  # one token at the pause's end
    assert wakes(out) == [pytest.approx(2.2)]


def test_past_max_attempts_a_throttled_call_fails_naming_the_provider() -> None:
    d = driver(ProviderLimits(name="tavily", rate=100.0, burst=5.0, max_attempts=2))
    d.arrive(search("q", "tavily"))
    d.at(0.1)(ev.ProviderThrottled(0.1, "q"))
    d.at(1.0)(ev.Wake(1.0))
    d.at(1.1)(ev.ProviderThrottled(1.1, "q", reason="HTTP 429"))
    r = d.result("q")
    assert r.status is Status.FAILED
    assert r.reason == "provider 'tavily': answered 429 to 2 attempts: HTTP 429"


def test_a_spent_budget_fails_at_once_with_the_reason_and_never_hangs() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, concurrency=2, budget=3))
    d.arrive(*(search(f"q{i}", "p") for i in range(5)))
    d.at(0.1).finish("q0")
    d.at(0.1).finish("q1")
    assert calls(d.log) == ["q0", "q1", "q2"]  # two answered, one in flight: the third call
    d.at(0.2).finish("q2", status=Status.FAILED, reason="HTTP 500")  # not answered: not billed
    assert calls(d.log)[-1] == "q3"
    d.at(0.3).finish("q3")
    why = "provider 'p': budget of 3 calls spent (3 answered)"
    assert d.result("q4").status is Status.FAILED and d.result("q4").reason == why
    d.at(0.4).arrive(search("late", "p"))
    assert d.result("late").status is Status.FAILED and d.result("late").reason == why
    assert d.core.providers.by_name["p"].failed_budget == 2


def test_a_call_that_waits_past_its_deadline_times_out_naming_the_provider() -> None:
    d = driver(ProviderLimits(name="jina", rate=1.0, burst=1.0, concurrency=1))
    d.arrive(search("a", "jina", timeout=30.0), search("b", "jina", timeout=2.0))
    out = d.at(2.0)(ev.Wake(2.0))
    r = d.result("b")
    assert r.status is Status.TIMED_OUT
    assert r.reason == "provider 'jina': no token and slot within the deadline (1 of 1 slots busy, rate 1/s)"
    assert calls(out) == []


def test_identical_calls_coalesce_into_one_and_share_its_answer() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=4))
    out = d.arrive(*(search(f"s{i}", "p", key="tenant-a|who wrote hamlet") for i in range(8)))
    assert calls(out) == ["s0"]
    d.arrive(search("other", "p", key="tenant-a|another query"))  # waits for a token
    d.at(0.4).finish("s0", output={"result": ["shakespeare"]})
    for i in range(8):
        r = d.result(f"s{i}")
        assert (r.status, r.output) == (Status.SUCCEEDED, {"result": ["shakespeare"]})
    p = d.core.providers.by_name["p"]
    assert (p.sent, p.coalesced, p.spent) == (1, 7, 1)
    assert "coalesced with s0" in " ".join(d.core.story("s3"))
    # once answered, the same key starts a new call (the cache is the manager's)
    d.at(1.0).arrive(search("again", "p", key="tenant-a|who wrote hamlet"))
    d.at(2.0)(ev.Wake(2.0))
    assert sorted(calls(d.log)) == ["again", "other", "s0"]
    assert "coalesced" not in " ".join(d.core.story("again"))


def test_a_cancelled_leader_hands_the_call_to_its_first_follower() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=4))
    d.arrive(search("busy", "p"))
    d.arrive(search("l", "p", key="k"), search("f1", "p", key="k"), search("f2", "p", key="k"))
    d.at(0.5)(ev.CancelRequested(0.5, "l"))
    assert d.result("l").status is Status.CANCELLED
    assert calls(d.at(1.0)(ev.Wake(1.0))) == ["f1"]
    d.at(1.2).finish("f1", output="x")
    assert d.result("f2").output == "x" and d.result("f2").status is Status.SUCCEEDED


def test_a_failed_call_fails_its_followers_with_the_same_reason() -> None:
    d = driver(ProviderLimits(name="p", rate=10.0, burst=1.0))
    d.arrive(search("l", "p", key="k"), search("f", "p", key="k"))
    d.at(0.2).finish("l", status=Status.TIMED_OUT, reason="provider 'p': no answer within 30 s")
    assert d.result("f").status is Status.TIMED_OUT
    assert d.result("f").reason == "provider 'p': no answer within 30 s"


def test_unknown_provider_is_rejected_naming_the_declared_ones_and_others_unaffected() -> None:
    d = driver(ProviderLimits(name="serper", rate=1.0), ProviderLimits(name="jina", rate=1.0))
    d.arrive(search("x", "nope"), search("y", "serper", kind=ActionKind.FETCH))
    assert d.result("x").status is Status.REJECTED
    assert d.result("x").reason == "unknown provider 'nope' (providers: jina, serper)"
    assert calls(d.log) == ["y"]


def test_a_cancelled_call_in_flight_keeps_its_slot_until_the_report() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=5.0, concurrency=1))
    d.arrive(search("a", "p"), search("b", "p"))
    out = d.at(0.1)(ev.CancelRequested(0.1, "a"))
    assert d.result("a").status is Status.CANCELLED
    assert [(c.action_id, c.node) for c in out if isinstance(c, cmd.CancelAction)] == [("a", "")]
    assert calls(d.log) == ["a"]  # b still waits: the provider may still be answering a
    out = d.at(0.3).finish("a")  # the late report frees the slot
    assert calls(out) == ["b"]
    assert d.core.providers.by_name["p"].spent == 1


def test_no_providers_no_provider_commands() -> None:
    d = Driver([cpu_node("n0")])
    d.arrive(search("x"))
    assert d.result("x").status is Status.REJECTED
    assert d.result("x").reason == "unknown provider 'serper' (providers: none declared)"
    assert not [c for c in d.log if isinstance(c, cmd.WakeAt | cmd.CallProvider)]


def test_bucket_arithmetic() -> None:
    b = Bucket(ProviderLimits(name="p", rate=2.0, burst=3.0))
    assert b.tokens == 3.0
    for _ in range(3):
        assert b.ready(0.0)
        b.take()
    assert not b.ready(0.0) and b.next_token_at(0.0) == 0.5
    assert b.next_token_at(0.2) == pytest.approx(0.5)
    b.refill(10.0)
    assert b.tokens == 3.0  # never past the burst
    b.pause(10.0, 4.0)
    assert not b.ready(13.9) and b.next_token_at(12.0) == 14.0
    assert b.ready(14.0)
    b.take()
    assert b.next_token_at(14.0) == 14.5


@pytest.mark.parametrize(("kw", "field"), [
    ({"rate": 0.0}, "providers['p'].rate"),
    ({"rate": math.inf}, "providers['p'].rate"),
    ({"rate": 1.0, "burst": 0.5}, "providers['p'].burst"),
    ({"rate": 1.0, "concurrency": 0}, "providers['p'].concurrency"),
    ({"rate": 1.0, "budget": -1}, "providers['p'].budget"),
    ({"rate": 1.0, "decrease": 1.0}, "providers['p'].decrease"),
    ({"rate": 1.0, "min_rate": 2.0}, "providers['p'].min_rate"),
    ({"rate": 1.0, "max_attempts": 0}, "providers['p'].max_attempts"),
])
def test_bad_limits_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError) as got:
        ProviderLimits(name="p", **kw)
    assert str(got.value).startswith(f"{field}: ")


def test_a_provider_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="must name each provider once"):
        CoreConfig(providers=(ProviderLimits(name="p", rate=1.0), ProviderLimits(name="p", rate=2.0)))


def test_an_answer_from_the_cache_costs_no_token_slot_or_budget() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=1, budget=1))
    d.arrive(search("a", "p"))  # holds the token and the slot
    hit = {"provider": "p", "result": {"organic": []}, "cached": True}
    spec = search("h", "p")
    out = d.arrive(ActionSpec("h", kind=ActionKind.SEARCH, tag="p", demand=Resources(),
                              payload={**spec.payload, "cached": hit}))
    assert calls(out) == [] and d.result("h").status is Status.SUCCEEDED
    assert d.result("h").output == hit
    p = d.core.providers.by_name["p"]
    assert (p.sent, p.spent, p.cache_hits, p.budget_left) == (1, 0, 1, 1)


def test_the_semaphore_baseline_sends_without_pacing_fifo_and_fails_a_429() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=16),
               provider_policy="semaphore", provider_semaphore=3)
    out = d.arrive(search("slow", "p", expected=8.0), search("a", "p", expected=0.5),
                   search("b", "p", expected=0.5), search("c", "p", expected=0.5))
    assert calls(out) == ["slow", "a", "b"] and wakes(out) == []  # 3 slots, no tokens, FIFO
    out = d.at(0.1)(ev.ProviderThrottled(0.1, "a"))
    assert d.result("a").status is Status.FAILED
    assert d.result("a").reason == "provider 'p': HTTP 429 (not retried)"
    assert calls(out) == ["c"]
    assert d.core.providers.by_name["p"].bucket.rate == 1.0  # nothing learned


def test_the_static_split_gives_each_trajectory_its_slice_of_rate_and_slots() -> None:
    d = driver(ProviderLimits(name="p", rate=4.0, burst=4.0, concurrency=4),
               provider_policy="static-split", trajectories=2)

    def s(aid: str, traj: str) -> ActionSpec:
        return ActionSpec(aid, kind=ActionKind.SEARCH, tag="p", demand=Resources(), trajectory=traj,
                          payload={"query": aid})

    out = d.arrive(s("a1", "ta"), s("a2", "ta"), s("b1", "tb"))
    # 2/s and 2 slots per trajectory, burst 1; the second slice's first token 1/4 s later
    # (the slices' tokens interleave: together never faster than the provider's 4/s)
    assert calls(out) == ["a1"] and wakes(out) == [0.5, 0.25]  # (a1 alone, then b1 arrived)
    assert calls(d.at(0.25)(ev.Wake(0.25))) == ["b1"]
    assert calls(d.at(0.5)(ev.Wake(0.5))) == ["a2"]
    assert [c.provider for c in d.log if isinstance(c, cmd.CallProvider)] == ["p", "p", "p"]
    d.at(0.6)(ev.ProviderThrottled(0.6, "a2"))  # static: nothing is learned, it waits again
    assert d.core.providers.by_name["p#0"].bucket.rate == 2.0 and d.status("a2") is Status.QUEUED


def test_without_coalescing_identical_calls_each_make_a_call() -> None:
    d = driver(ProviderLimits(name="p", rate=10.0, burst=3.0), provider_coalesce=False)
    out = d.arrive(*(search(f"s{i}", "p", key="k") for i in range(3)))
    assert calls(out) == ["s0", "s1", "s2"]


def test_an_hourly_budget_fails_past_it_with_the_reset_and_serves_again_next_hour() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, budget_per_hour=2))
    d.at(10.0).arrive(search("a", "p"), search("b", "p"), search("c", "p"))
    assert calls(d.log) == ["a", "b"]  # c waits: the two in flight may still be answered
    d.at(10.5).finish("a")
    d.at(10.5).finish("b")
    r = d.result("c")
    assert r.status is Status.FAILED
    assert r.reason == "provider 'p': budget of 2 calls per hour spent (the next hour starts in 3600 s)"
    d.at(3610.0).arrive(search("next", "p"))  # the next window: served
    assert calls(d.log)[-1] == "next"
    assert d.core.providers.by_name["p"].hour_spent == 0


def stepped(aid: str, step: int | None, provider: str = "p", key: str | None = None) -> ActionSpec:
    spec = search(aid, provider, key=key)
    payload = dict(spec.payload) if step is None else {**spec.payload, "step": step}
    return ActionSpec(aid, kind=ActionKind.SEARCH, tag=provider, demand=Resources(), payload=payload)


def test_a_per_step_budget_fails_the_call_past_it_at_once_naming_provider_step_and_budget() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, concurrency=2, budget_per_step=3))
    out = d.arrive(*(stepped(f"a{i}", 7) for i in range(5)))
    assert calls(out) == ["a0", "a1"]  # a2 waits for a slot, charged; a3 and a4 past the budget
    why = "provider 'p': budget of 3 calls for step 7 spent (3 answered or in flight)"
    assert [(d.result(a).status, d.result(a).reason) for a in ("a3", "a4")] == [(Status.FAILED, why)] * 2
    p = d.core.providers.by_name["p"]
    assert (p.step, p.step_used, p.failed_step_budget) == (7, {7: 3}, 2)
    # a call that fails unanswered is refunded: one more call of step 7 may go
    d.at(0.1).finish("a0", status=Status.FAILED, reason="HTTP 500")
    d.at(0.1).finish("a1")
    assert p.step_used == {7: 2}
    d.at(0.2).arrive(stepped("a5", 7))
    assert calls(d.log) == ["a0", "a1", "a2", "a5"]
    d.at(0.2).arrive(stepped("a6", 7))
    assert d.result("a6").reason == why
    # step 8 begins: its own budget; a call naming no step belongs to the latest step (8)
    d.at(0.3).arrive(stepped("b0", 8), stepped("b1", None), stepped("b2", 8))
    d.at(0.3).arrive(stepped("b3", None))
    assert d.result("b3").reason == ("provider 'p': budget of 3 calls for step 8 spent "
                                     "(3 answered or in flight)")
    assert (p.step, p.step_used, p.failed_step_budget) == (8, {7: 3, 8: 3}, 4)
    s = d.core.providers.stats()["p"]
    assert (s["budget_per_step"], s["step"], s["step_used"], s["failed_step_budget"]) == (3, 8, 3, 4)


def test_a_per_step_budget_charges_no_follower_no_cache_hit_and_refunds_what_waits_and_ends() -> None:
    d = driver(ProviderLimits(name="p", rate=1.0, burst=1.0, concurrency=1, budget_per_step=2))
    d.arrive(*(stepped(f"s{i}", 1, key="t|same") for i in range(8)))  # one call, 7 followers
    d.arrive(stepped("other", 1))  # waits for a token, charged
    p = d.core.providers.by_name["p"]
    assert p.step_used == {1: 2} and calls(d.log) == ["s0"]
    hit = {"provider": "p", "result": {}, "cached": True}
    d.arrive(ActionSpec("h", kind=ActionKind.SEARCH, tag="p", demand=Resources(),
                        payload={"query": "h", "step": 1, "cached": hit}))
    assert d.result("h").status is Status.SUCCEEDED and p.step_used == {1: 2}
    d.at(0.5)(ev.CancelRequested(0.5, "other"))  # cancelled while waiting: refunded
    assert d.result("other").status is Status.CANCELLED and p.step_used == {1: 1}
    d.at(0.6).finish("s0")
    assert {d.result(f"s{i}").status for i in range(8)} == {Status.SUCCEEDED}
    assert p.step_used == {1: 1} and d.core.providers.charged == {}


def test_without_a_per_step_budget_step_used_counts_answered_or_in_flight_and_refunds_the_rest() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, concurrency=1))
    out = d.arrive(stepped("a", 4), stepped("b", 4), stepped("c", 4), stepped("n", None))
    p = d.core.providers.by_name["p"]
    assert calls(out) == ["a"] and p.step_used == {4: 3}  # (a call naming no step: not counted)
    d.at(0.1).finish("a", status=Status.FAILED, reason="HTTP 500")  # unanswered: refunded
    assert p.step_used == {4: 2}
    d.at(0.2)(ev.CancelRequested(0.2, "c"))  # cancelled while waiting: refunded
    assert d.result("c").status is Status.CANCELLED and p.step_used == {4: 1}
    d.at(0.3).finish("b")  # answered: kept
    assert p.step_used == {4: 1}
    d.at(0.4).finish("n")
    assert p.step_used == {4: 1} and d.core.providers.charged == {}
    s = d.core.providers.stats()["p"]
    assert (s["budget_per_step"], s["step"], s["step_used"], s["failed_step_budget"]) == (None, 4, 1, 0)
    assert d.core.provider_stats() == d.core.providers.stats()  # (the engine's typed query)


def test_a_429_keeps_the_step_charge_and_a_cancelled_leader_hands_it_to_its_follower() -> None:
    d = driver(ProviderLimits(name="p", rate=100.0, burst=10.0, concurrency=4, budget_per_step=1))
    d.arrive(stepped("a", 3, key="t|q"), stepped("b", 3, key="t|q"))
    d.at(0.1)(ev.ProviderThrottled(0.1, "a"))  # waits again, still charged
    p = d.core.providers.by_name["p"]
    assert p.step_used == {3: 1} and d.status("a") is Status.QUEUED
    d.at(0.2)(ev.CancelRequested(0.2, "a"))  # b leads the call now, with a's charge
    assert d.result("a").status is Status.CANCELLED and calls(d.log) == ["a", "b"]  # (5 tokens)
    assert p.step_used == {3: 1} and d.core.providers.charged == {"b": ("p", 3)}
    d.at(0.4).finish("b")
    assert d.result("b").status is Status.SUCCEEDED and p.step_used == {3: 1}
    d.at(0.5).arrive(stepped("c", 3))
    assert d.result("c").reason == "provider 'p': budget of 1 calls for step 3 spent (1 answered or in flight)"
