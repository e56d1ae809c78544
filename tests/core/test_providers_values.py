"""Provider quotas, exact values (issue 43 item 2): `core/providers.py` driven directly.

Each figure below is worked out by hand from the module's rules: a token bucket of ``rate``
tokens per second up to ``burst``, paused by Retry-After; AIMD (a 429 multiplies the rate by
``decrease``, down to ``min_rate`` or rate / 64; each success adds ``probe_per_s`` or rate / 10
per second since the last change); budgets in total, per fixed hour from the first call and per
RL step; the waiting order (rank, arrival; aged first) and every refusal's text word for word.
"""

from __future__ import annotations

import math

import pytest

from arl_tangram.core.providers import (
    Bucket,
    Dispatch,
    Provider,
    ProviderLimits,
    Providers,
    rank_of,
)

INF = math.inf


def lim(**kw) -> ProviderLimits:
    kw.setdefault("name", "p")
    kw.setdefault("rate", 2.0)
    return ProviderLimits(**kw)


def sent(out: list[Dispatch]) -> list[str]:
    return [d.action_id for d in out]


# ---- limits ----------------------------------------------------------------------------------


def test_defaults_and_derived_floor_and_probe() -> None:
    p = ProviderLimits(name="s", rate=6.4)
    assert (p.burst, p.concurrency, p.budget, p.budget_per_hour, p.budget_per_step) == (
        1.0,
        16,
        None,
        None,
        None,
    )
    assert (p.decrease, p.min_rate, p.probe_per_s, p.max_attempts) == (0.5, None, None, 8)
    assert p.floor == pytest.approx(0.1) and p.probe == pytest.approx(0.64)
    q = ProviderLimits(name="s", rate=6.4, min_rate=0.5, probe_per_s=0.0)
    assert q.floor == 0.5 and q.probe == 0.0


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"name": ""}, "providers[].name: must be a non-empty string, got ''"),
        ({"name": 3}, "providers[].name: must be a non-empty string, got 3"),
        ({"rate": 0.0}, "providers['p'].rate: must be a finite number >= 0 and > 0, got 0.0"),
        ({"rate": -1.0}, "providers['p'].rate: must be a finite number >= 0 and > 0, got -1.0"),
        ({"rate": "2"}, "providers['p'].rate: must be a finite number >= 0 and > 0, got '2'"),
        ({"rate": math.nan}, "providers['p'].rate: must be a finite number >= 0 and > 0, got nan"),
        ({"rate": INF}, "providers['p'].rate: must be a finite number >= 0 and > 0, got inf"),
        ({"burst": 0.5}, "providers['p'].burst: must be a finite number >= 1 and > 0, got 0.5"),
        ({"burst": INF}, "providers['p'].burst: must be a finite number >= 1 and > 0, got inf"),
        ({"concurrency": 0}, "providers['p'].concurrency: must be an integer >= 1, got 0"),
        ({"concurrency": True}, "providers['p'].concurrency: must be an integer >= 1, got True"),
        ({"concurrency": 2.0}, "providers['p'].concurrency: must be an integer >= 1, got 2.0"),
        ({"budget": -1}, "providers['p'].budget: must be an integer >= 0 or None, got -1"),
        ({"budget": 1.5}, "providers['p'].budget: must be an integer >= 0 or None, got 1.5"),
        (
            {"budget_per_hour": -1},
            "providers['p'].budget_per_hour: must be an integer >= 0 or None, got -1",
        ),
        (
            {"budget_per_hour": True},
            "providers['p'].budget_per_hour: must be an integer >= 0 or None, got True",
        ),
        (
            {"budget_per_hour": 2.0},
            "providers['p'].budget_per_hour: must be an integer >= 0 or None, got 2.0",
        ),
        (
            {"budget_per_step": -1},
            "providers['p'].budget_per_step: must be an integer >= 0 or None, got -1",
        ),
        (
            {"budget_per_step": False},
            "providers['p'].budget_per_step: must be an integer >= 0 or None, got False",
        ),
        ({"decrease": 0.0}, "providers['p'].decrease: must be in (0, 1), got 0.0"),
        ({"decrease": 1.0}, "providers['p'].decrease: must be in (0, 1), got 1.0"),
        ({"decrease": "0.5"}, "providers['p'].decrease: must be in (0, 1), got '0.5'"),
        ({"min_rate": 0.0}, "providers['p'].min_rate: must be in (0, rate=2], got 0.0"),
        ({"min_rate": 2.5}, "providers['p'].min_rate: must be in (0, rate=2], got 2.5"),
        (
            {"probe_per_s": -0.1},
            "providers['p'].probe_per_s: must be a finite number >= 0, got -0.1",
        ),
        ({"probe_per_s": INF}, "providers['p'].probe_per_s: must be a finite number >= 0, got inf"),
        ({"max_attempts": 0}, "providers['p'].max_attempts: must be an integer >= 1, got 0"),
        ({"max_attempts": 1.0}, "providers['p'].max_attempts: must be an integer >= 1, got 1.0"),
    ],
)
def test_each_bad_limit_is_refused_word_for_word(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        lim(**kw)
    assert str(e.value) == msg


def test_limits_at_their_edges_are_accepted() -> None:
    p = lim(
        rate=1e-9,
        burst=1.0,
        concurrency=1,
        budget=0,
        budget_per_hour=0,
        budget_per_step=0,
        decrease=1e-9,
        min_rate=1e-9,
        probe_per_s=0.0,
        max_attempts=1,
    )
    assert p.rate == 1e-9 and p.min_rate == 1e-9
    assert lim(rate=3, burst=2, decrease=0.999).decrease == 0.999


# ---- the bucket ----------------------------------------------------------------------------


def test_a_bucket_starts_full_and_refills_at_its_rate_up_to_the_burst() -> None:
    b = Bucket(lim(rate=2.0, burst=3.0), now=5.0)
    assert (b.rate, b.tokens, b.t, b.paused_until, b.last_decrease, b.changed) == (
        2.0,
        3.0,
        5.0,
        -INF,
        -INF,
        5.0,
    )
    assert isinstance(b.rate, float) and isinstance(b.tokens, float)
    for _ in range(3):
        b.take()
    b.take()  # (never below 0)
    assert b.tokens == 0.0
    assert not b.ready(5.25)
    assert (b.tokens, b.t) == (0.5, 5.25)
    assert b.next_token_at(5.25) == 5.5
    assert b.ready(5.5) and b.tokens == 1.0 and b.next_token_at(5.5) == 5.5
    b.refill(5.0)  # (the past: nothing)
    assert (b.tokens, b.t) == (1.0, 5.5)
    b.refill(100.0)
    assert b.tokens == 3.0 and b.t == 100.0


def test_a_token_within_the_tolerance_counts_as_whole() -> None:
    b = Bucket(lim(rate=1.0), now=0.0)
    b.take()
    b.tokens = 1.0 - 5e-10
    assert b.ready(0.0) and b.next_token_at(0.0) == 0.0
    b.tokens = 1.0 - 2e-9
    assert not b.ready(0.0)
    assert b.next_token_at(0.0) == pytest.approx(2e-9)


def test_retry_after_pauses_then_gives_one_token_and_accrues_only_after_it() -> None:
    b = Bucket(lim(rate=2.0, burst=3.0), now=0.0)
    b.take(), b.take(), b.take()
    b.pause(1.0, 2.0)  # (refilled to 2 first, then exactly one token)
    assert (b.tokens, b.paused_until, b.t) == (1.0, 3.0, 1.0)
    assert not b.ready(2.0) and b.t == 1.0  # (not refilled while paused)
    assert not b.ready(3.0 - 2e-9)
    assert b.next_token_at(2.0) == 3.0
    b.take()
    assert b.next_token_at(2.0) == 3.5  # (the pause's end, then 1 token / 2 per s)
    b.refill(2.5)  # (inside the pause: no tokens, the clock moves)
    assert (b.tokens, b.t) == (0.0, 2.5)
    b.refill(3.25)  # (accrues from the pause's end only: 0.25 s x 2)
    assert (b.tokens, b.t) == (0.5, 3.25)
    b.refill(3.5)
    assert b.tokens == 1.0
    assert b.ready(3.0 - 5e-10 + 0.5)
    b.pause(4.0, -5.0)  # (a negative pause is none; an earlier end never shortens one)
    assert b.paused_until == 4.0 and b.tokens == 1.0
    b.pause(4.0, 10.0)
    b.pause(5.0, 1.0)
    assert b.paused_until == 14.0


def test_a_refill_right_after_a_pause_ended_counts_from_its_end() -> None:
    b = Bucket(lim(rate=1.0, burst=5.0), now=0.0)
    b.take()
    b.pause(0.0, 2.0)
    b.take()  # (0 tokens, paused to 2)
    b.refill(1.0)
    assert (b.tokens, b.t) == (0.0, 1.0)
    b.refill(4.0)  # (t=1 < pause end 2: from 2 to 4)
    assert b.tokens == 2.0
    b.refill(6.0)  # (t=4 past the pause: from 4)
    assert b.tokens == 4.0


def test_a_429_multiplies_the_rate_once_per_round_down_to_the_floor() -> None:
    b = Bucket(lim(rate=8.0, burst=4.0), now=0.0)
    assert b.throttled(1.0, sent_at=0.5)
    assert (b.rate, b.tokens, b.last_decrease, b.changed) == (4.0, 0.0, 1.0, 1.0)
    assert not b.throttled(1.5, sent_at=0.9)  # (sent before the decrease: the same round)
    assert b.rate == 4.0
    assert b.throttled(2.0, sent_at=1.0)  # (sent at the decrease: a new round)
    assert b.rate == 2.0
    for t in range(3, 20):
        b.throttled(float(t), float(t))
    assert b.rate == 0.125  # rate / 64
    c = Bucket(lim(rate=8.0, min_rate=3.0, decrease=0.25), now=0.0)
    c.throttled(0.0, 0.0)
    assert c.rate == 3.0


def test_a_429_refills_before_emptying() -> None:
    b = Bucket(lim(rate=2.0, burst=2.0), now=0.0)
    b.take(), b.take()
    b.throttled(1.0, 1.0)
    assert (b.tokens, b.t) == (0.0, 1.0)
    b.refill(1.5)  # (accrues at the new rate, 1/s, from 1.0)
    assert b.tokens == 0.5


def test_success_probes_the_rate_back_up_by_probe_per_second() -> None:
    b = Bucket(lim(rate=10.0, burst=4.0), now=0.0)
    b.succeeded(3.0)  # (at the limit: only the clock of the last change moves)
    assert (b.rate, b.changed) == (10.0, 3.0)
    b.throttled(4.0, 4.0)
    assert b.rate == 5.0 and b.changed == 4.0
    b.take()
    b.succeeded(6.0)  # + 1 req/s per second x 2 s
    assert (b.rate, b.changed) == (7.0, 6.0)
    assert b.t == 6.0 and b.tokens == 4.0  # (refilled before: 2 s x 5/s, capped at 4)
    b.succeeded(6.0)  # (no time: nothing)
    assert (b.rate, b.changed) == (7.0, 6.0)
    b.succeeded(100.0)
    assert (b.rate, b.changed) == (10.0, 100.0)
    c = Bucket(lim(rate=10.0, probe_per_s=0.5), now=0.0)
    c.throttled(0.0, 0.0)
    c.succeeded(4.0)
    assert c.rate == 7.0


# ---- one provider ---------------------------------------------------------------------------


def test_budget_left_is_the_smaller_of_total_and_this_hour() -> None:
    assert Provider(lim()).budget_left is None
    p = Provider(lim(budget=10))
    p.spent = 4
    assert p.budget_left == 6
    p = Provider(lim(budget_per_hour=5))
    p.hour_spent = 2
    assert p.budget_left == 3
    p = Provider(lim(budget=10, budget_per_hour=5))
    p.spent, p.hour_spent = 8, 1
    assert p.budget_left == 2
    p.spent = 1
    assert p.budget_left == 4


def test_the_hour_starts_at_the_first_call_and_rolls_in_whole_hours() -> None:
    p = Provider(lim())
    p.roll(10.0)
    assert p.hour_start is None
    p = Provider(lim(budget_per_hour=3))
    p.roll(10.0)
    assert p.hour_start == 10.0
    p.hour_spent = 3
    p.roll(3609.0)
    assert (p.hour_start, p.hour_spent) == (10.0, 3)
    p.roll(3610.0)  # (exactly an hour on: a new window)
    assert (p.hour_start, p.hour_spent) == (3610.0, 0)
    p.hour_spent = 2
    p.roll(3610.0 + 3 * 3600.0 + 5.0)  # three hours and more: the window that holds now
    assert (p.hour_start, p.hour_spent) == (3610.0 + 3 * 3600.0, 0)


def test_charge_step_counts_per_step_and_refuses_past_the_budget_word_for_word() -> None:
    p = Provider(lim(name="serp", budget_per_step=2))
    assert p.charge_step(None) == (0, "")  # (no step yet: step 0)
    assert p.step is None
    assert p.charge_step(3) == (3, "") and p.step == 3
    assert p.charge_step(None) == (3, "")  # (the latest step seen)
    assert p.charge_step(2) == (2, "") and p.step == 3  # (an older step: not the latest)
    assert p.step_used == {0: 1, 3: 2, 2: 1}
    assert p.charge_step(3) == (
        3,
        "provider 'serp': budget of 2 calls for step 3 spent (2 answered or in flight)",
    )
    assert p.failed_step_budget == 1 and p.step_used[3] == 2
    p.refund_step(3)
    assert p.step_used[3] == 1
    p.refund_step(9)  # (never charged: nothing, no negative count)
    p.refund_step(0)
    p.refund_step(0)
    assert p.step_used == {0: 0, 3: 1, 2: 1}
    q = Provider(lim(budget_per_step=0))
    assert q.charge_step(None)[1] == (
        "provider 'p': budget of 0 calls for step 0 spent (0 answered or in flight)"
    )


def test_charge_step_keeps_the_latest_64_steps_counted() -> None:
    p = Provider(lim())
    for s in range(65):
        p.charge_step(s)
    assert sorted(p.step_used) == list(range(65))  # (65 kept until a newer step arrives)
    p.charge_step(65)
    assert sorted(p.step_used) == list(range(1, 66))
    p.charge_step(70)
    assert sorted(p.step_used) == [*range(2, 66), 70]
    p.charge_step(70)  # (not newer: nothing forgotten)
    assert len(p.step_used) == 65 and p.step_used[70] == 2


def test_a_provider_s_stats_word_for_word() -> None:
    p = Provider(
        lim(
            name="s",
            rate=3.0,
            burst=2.0,
            concurrency=4,
            budget=9,
            budget_per_hour=7,
            budget_per_step=5,
        )
    )
    p.bucket.rate = 1.23456789
    p.inflight = {"a": 0.0}
    p.entry = {"b": (3, 1), "c": (3, 2)}
    p.sent, p.throttles, p.decreases, p.pauses, p.coalesced = 11, 12, 13, 14, 15
    p.cache_hits, p.failed_budget, p.hour_spent, p.failed_step_budget, p.timed_out = (
        16,
        17,
        2,
        18,
        19,
    )
    p.spent = 3
    p.step_used = {0: 1, 4: 3}
    assert p.stats() == {
        "rate": 1.234568,
        "rate_limit": 3.0,
        "burst": 2.0,
        "concurrency": 4,
        "in_flight": 1,
        "waiting": 2,
        "sent": 11,
        "throttled": 12,
        "rate_decreases": 13,
        "pauses": 14,
        "coalesced": 15,
        "served_from_cache": 16,
        "budget": 9,
        "budget_left": 5,
        "failed_budget": 17,
        "budget_per_hour": 7,
        "hour_spent": 2,
        "budget_per_step": 5,
        "step": None,
        "step_used": 1,
        "failed_step_budget": 18,
        "timed_out_waiting": 19,
    }
    p.step = 4
    assert p.stats()["step"] == 4 and p.stats()["step_used"] == 3
    q = Provider(lim())
    assert (
        q.sent,
        q.throttles,
        q.decreases,
        q.pauses,
        q.coalesced,
        q.cache_hits,
        q.failed_budget,
        q.failed_step_budget,
        q.timed_out,
        q.spent,
        q.hour_spent,
    ) == (0,) * 11
    assert (q.hour_start, q.step, q.step_used, q.slice_idx, q.weight, q._pick) == (
        None,
        None,
        {},
        -1,
        None,
        "",
    )
    assert q.stats()["step_used"] == 0


def test_the_heap_gives_rank_then_arrival_and_skips_stale_entries() -> None:
    p = Provider(lim())
    p.push("a", 5, 1)
    p.push("b", 4, 2)
    p.push("c", 4, 0)
    p.push("a", 1, 1)  # (aged again: the old entry is stale)
    assert p.head() == "a"
    assert p.pop() == "a" and "a" not in p.entry
    assert p.head() == "c"  # (the stale ("a", 5, 1) is still in the heap)
    p.drop("c")
    p.drop("zz")
    assert p.head() == "b" and p.pop() == "b"
    assert p.head() is None and p.heap == []


def test_with_tenants_the_one_with_fewest_calls_in_flight_per_weight_goes_next() -> None:
    p = Provider(lim())
    w = {"x": 2.0, "y": 1.0}
    p.weight = w.__getitem__
    p.tenant_of = {"x1": "x", "x2": "x", "y1": "y", "y2": "y"}
    p.push("x1", 9, 1)
    p.push("y1", 3, 2)
    p.push("x2", 9, 3)
    p.push("y2", 3, 4)
    assert p.heap == [] and sorted(p.theaps) == ["x", "y"]
    # none in flight: 0/2 == 0/1, then the better rank: y
    assert p.head() == "y1" and p._pick == "y"
    assert p.pop() == "y1"
    p.sent_one("y1")
    assert p.busy == {"y": 1}
    assert p.pop() == "x1"  # (x: 0/2 < y: 1/1)
    p.sent_one("x1")
    assert p.busy == {"y": 1, "x": 1}
    assert p.head() == "x2"  # (x: 1/2 < y: 1/1)
    p.landed("y1", True)
    assert p.busy == {"x": 1} and "y1" not in p.tenant_of
    assert p.head() == "y2"  # (y: 0 < x: 0.5)
    p.landed("x1", False)  # (it waits again: its tenant is kept)
    assert p.busy == {} and p.tenant_of["x1"] == "x"
    p.drop("y2")
    assert p.head() == "x2" and "y" not in p.theaps  # (an empty tenant heap is dropped)
    p.drop("x2")
    assert p.head() is None and p.theaps == {}


def test_an_untenanted_call_under_fair_share_waits_as_tenant_empty() -> None:
    p = Provider(lim())
    p.weight = lambda t: 1.0
    p.push("a", 2, 0)
    assert p.theaps == {"": [(2, 0, "a")]}
    p.sent_one(p.pop())
    assert p.busy == {"": 1}
    p.landed("a", True)
    assert p.busy == {}


def test_with_equal_load_the_better_head_goes_first_rank_then_seq() -> None:
    p = Provider(lim())
    p.weight = lambda t: 1.0
    p.tenant_of = {"a": "A", "b": "B"}
    p.push("a", 3, 5)
    p.push("b", 3, 4)
    assert p.head() == "b"
    p.push("a", 2, 5)
    assert p.head() == "a"


@pytest.mark.parametrize(
    ("expected", "weight", "rank"),
    [
        (0.0, 1.0, 1),
        (-1.0, 1.0, 1),
        (1.0, 1.0, 2002),
        (0.75, 1.0, 2001),
        (0.70, 1.0, 2000),
        (2.0, 2.0, 2002),
        (4.0, 1.0, 2006),
        (3.0, 1.0, 2005),
        (math.sqrt(0.5), 1.0, 2001),
    ],
)
def test_rank_of_is_half_octave_classes_above_the_aged(
    expected: float, weight: float, rank: int
) -> None:
    assert rank_of(expected, weight) == rank


# ---- the providers together -----------------------------------------------------------------


def test_a_bad_policy_and_a_name_declared_twice_are_refused_word_for_word() -> None:
    with pytest.raises(ValueError) as e:
        Providers((), policy="fifo")
    assert str(e.value) == (
        "provider_policy: must be one of tangram, semaphore, static-split, got 'fifo'"
    )
    with pytest.raises(ValueError) as e:
        Providers((lim(name="a"), lim(name="b"), lim(name="a")))
    assert str(e.value) == "providers['a']: declared twice"


def test_the_defaults_of_a_providers_part() -> None:
    ps = Providers((lim(name="b"), lim(name="a")))
    assert (ps.policy, ps.paced, ps.semaphore, ps.coalesce, ps.trajectories, ps.aging_s) == (
        "tangram",
        True,
        None,
        True,
        1,
        30.0,
    )
    assert ps.active and ps.retry_429
    assert [p.limits.name for p in ps.base] == ["b", "a"]
    assert (ps.wake_sent, ps.refunded, ps.tenant_weight, ps._early) == (INF, None, None, 0.0)
    assert not Providers(()).active
    s = Providers((lim(),), policy="semaphore", trajectories=0)
    assert (s.paced, s.retry_429, s.trajectories) == (False, False, 1)
    assert Providers((lim(),), policy="static-split", trajectories=3).paced


def test_an_unknown_provider_is_refused_naming_the_declared_ones() -> None:
    ps = Providers((lim(name="b"), lim(name="a")))
    assert ps.arrive("x", "z", None, 5, 0, 0.0, INF) == "unknown provider 'z' (providers: a, b)"
    assert Providers(()).arrive("x", "z", "k", 5, 0, 0.0, INF) == (
        "unknown provider 'z' (providers: none declared)"
    )
    assert ps.owner == {} and ps.leaders == {} and ps.timers == []


def test_arrive_queues_with_its_timers_and_ready_sends_in_rank_then_arrival_order() -> None:
    ps = Providers((lim(rate=1.0, burst=3.0, concurrency=2),), aging_s=7.0)
    assert ps.arrive("a", "p", None, 2005, 1, 0.0, 4.0) == ""
    assert ps.arrive("b", "p", None, 2003, 2, 0.0, INF) == ""
    assert ps.arrive("c", "p", None, 2003, 3, 0.0, INF) == ""
    assert ps.owner == {"a": "p", "b": "p", "c": "p"}
    assert ps.deadline == {"a": 4.0, "b": INF, "c": INF}
    assert sorted(ps.timers) == [
        (4.0, 2, "due", "a"),
        (7.0, 1, "age", "a"),
        (7.0, 3, "age", "b"),
        (7.0, 4, "age", "c"),
    ]
    out = ps.ready(0.0)
    assert out == [Dispatch("b", "p"), Dispatch("c", "p")]  # (2 slots)
    prov = ps.by_name["p"]
    assert prov.inflight == {"b": 0.0, "c": 0.0} and prov.sent == 2
    assert prov.bucket.tokens == 1.0
    assert ps.deadline == {"a": 4.0}
    assert ps.ready(0.0) == []  # (no slot)
    ps.finished("b", 0.5, True)
    assert (prov.spent, prov.hour_spent, list(prov.inflight)) == (1, 1, ["c"])
    assert "b" not in ps.owner
    assert sent(ps.ready(0.5)) == ["a"]


def test_without_a_token_nothing_leaves_and_next_wake_is_the_next_token() -> None:
    ps = Providers((lim(rate=4.0, burst=1.0, concurrency=5),))
    for i, aid in enumerate("abc"):
        ps.arrive(aid, "p", None, 2000, i, 0.0, INF)
    assert sent(ps.ready(0.0)) == ["a"]
    assert ps.next_wake(0.0) == 0.25
    assert ps.ready(0.2) == []
    assert ps.next_wake(0.2) == pytest.approx(0.25)
    assert sent(ps.ready(0.25)) == ["b"]
    assert ps.next_wake(0.3) == pytest.approx(0.5)


def test_next_wake_is_inf_without_waiters_without_a_slot_without_budget_or_unpaced() -> None:
    ps = Providers((lim(rate=1.0, concurrency=1),))
    assert ps.next_wake(0.0) == INF
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    ps.arrive("b", "p", None, 2000, 1, 0.0, INF)
    ps.ready(0.0)
    assert ps.next_wake(0.0) == INF  # (b waits for a slot: a report frees it)
    ps.finished("a", 0.1, True)
    assert ps.next_wake(0.1) == 1.0
    bp = Providers((lim(rate=1.0, budget=1),))
    bp.arrive("a", "p", None, 2000, 0, 0.0, INF)
    bp.arrive("b", "p", None, 2000, 1, 0.0, INF)
    assert sent(bp.ready(0.0)) == ["a"]
    assert bp.next_wake(0.0) == INF  # (budget 1, 1 in flight: no token can send b)
    sp = Providers((lim(rate=1.0),), policy="semaphore")
    sp.arrive("a", "p", None, 2000, 0, 0.0, INF)
    assert sp.next_wake(0.0) == INF


def test_the_earliest_of_several_providers_wakes() -> None:
    ps = Providers((lim(name="slow", rate=1.0), lim(name="fast", rate=4.0)))
    for name in ("slow", "fast"):
        ps.arrive(name + "1", name, None, 2000, 0, 0.0, INF)
        ps.arrive(name + "2", name, None, 2000, 1, 0.0, INF)
    assert sent(ps.ready(0.0)) == ["slow1", "fast1"]
    assert ps.next_wake(0.0) == 0.25


def test_the_semaphore_baseline_is_fifo_unpaced_and_capped_by_its_own_slots() -> None:
    ps = Providers((lim(rate=1.0, burst=1.0, concurrency=5),), policy="semaphore", semaphore=2)
    ps.arrive("a", "p", None, 2009, 0, 0.0, INF)
    ps.arrive("b", "p", None, 2001, 1, 0.0, INF)
    ps.arrive("c", "p", None, 2001, 2, 0.0, INF)
    assert ps.by_name["p"].entry == {"a": (1, 0), "b": (1, 1), "c": (1, 2)}
    assert sent(ps.ready(0.0)) == ["a", "b"]  # (no token needed, 2 slots)
    assert ps.by_name["p"].bucket.tokens == 1.0  # (nothing taken)
    ps.finished("a", 0.0, True)
    assert sent(ps.ready(0.0)) == ["c"]
    d = Providers((lim(rate=1.0, concurrency=3),), policy="semaphore")
    for i in range(5):
        d.arrive(str(i), "p", None, 2000, i, 0.0, INF)
    assert sent(d.ready(0.0)) == ["0", "1", "2"]  # (default: the provider's concurrency)


def test_a_429_under_the_semaphore_frees_the_slot_and_lowers_nothing() -> None:
    ps = Providers((lim(rate=4.0),), policy="semaphore")
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    ps.ready(0.0)
    prov = ps.throttled("a", 1.0, None)
    assert prov is ps.by_name["p"]
    assert (prov.bucket.rate, prov.decreases, prov.throttles, prov.inflight) == (4.0, 0, 1, {})


def test_a_429_lowers_the_rate_once_per_round_and_the_call_waits_again_in_its_place() -> None:
    ps = Providers((lim(rate=8.0, burst=3.0, concurrency=5),), aging_s=100.0)
    for i, aid in enumerate("abc"):
        ps.arrive(aid, "p", None, 2000 + i, i, 0.0, INF)
    assert sent(ps.ready(0.0)) == ["a", "b", "c"]
    prov = ps.by_name["p"]
    assert ps.throttled("a", 1.0, None) is prov
    assert (prov.bucket.rate, prov.decreases, prov.throttles) == (4.0, 1, 1)
    assert prov.inflight == {"b": 0.0, "c": 0.0}
    assert ps.throttled("b", 1.1, None) is prov  # (sent at 0, before the decrease at 1)
    assert (prov.bucket.rate, prov.decreases, prov.throttles) == (4.0, 1, 2)
    ps.requeue("a", 2000, 0, 1.1, 9.0)
    ps.requeue("b", 2001, 1, 1.1, INF)
    assert prov.entry == {"a": (2000, 0), "b": (2001, 1)}
    assert ps.deadline == {"a": 9.0, "b": INF}
    assert (9.0, 5, "due", "a") in ps.timers and (101.1, 4, "age", "a") in ps.timers
    assert (101.1, 6, "age", "b") in ps.timers and len(ps.timers) == 6
    assert ps.throttled("zz", 1.0, None) is None


def test_retry_after_pauses_the_bucket_and_counts_a_pause() -> None:
    ps = Providers((lim(rate=8.0, burst=3.0),))
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    ps.ready(0.0)
    prov = ps.throttled("a", 1.0, 5.0)
    assert (prov.pauses, prov.decreases, prov.bucket.rate) == (1, 0, 8.0)
    assert (prov.bucket.paused_until, prov.bucket.tokens) == (6.0, 1.0)
    ps.requeue("a", 2000, 0, 1.0, INF)
    assert ps.ready(5.9) == [] and ps.next_wake(5.9) == 6.0
    assert sent(ps.ready(6.0)) == ["a"]


def test_a_429_of_a_call_not_in_flight_counts_it_sent_now() -> None:
    ps = Providers((lim(rate=8.0),))
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)  # (waiting, not sent)
    prov = ps.throttled("a", 2.0, None)
    assert (prov.bucket.rate, prov.bucket.last_decrease) == (4.0, 2.0)


def test_a_total_budget_is_charged_by_answers_and_refuses_past_it_word_for_word() -> None:
    ps = Providers((lim(name="s", rate=100.0, burst=10.0, budget=2),))
    for i, aid in enumerate("abc"):
        assert ps.arrive(aid, "s", None, 2000, i, 0.0, INF) == ""
    assert sent(ps.ready(0.0)) == ["a", "b"]  # (2 in flight may spend the budget: c waits)
    assert ps.exhausted(0.0) == []
    ps.finished("a", 0.1, True)
    ps.finished("b", 0.1, False)  # (not answered: not spent)
    prov = ps.by_name["s"]
    assert (prov.spent, prov.budget_left) == (1, 1)
    assert sent(ps.ready(0.1)) == ["c"]
    ps.finished("c", 0.2, True)
    assert prov.budget_left == 0
    assert ps.arrive("d", "s", None, 2000, 3, 0.3, INF) == (
        "provider 's': budget of 2 calls spent (2 answered)"
    )
    assert prov.failed_budget == 1 and "d" not in ps.owner


def test_a_spent_budget_fails_the_waiting_ones_in_order_with_the_reason() -> None:
    ps = Providers((lim(name="s", rate=100.0, burst=10.0, budget=1), lim(name="t")))
    for i, aid in enumerate("abc"):
        ps.arrive(aid, "s", None, 2000, i, 0.0, INF)
    ps.arrive("t1", "t", None, 2000, 9, 0.0, INF)
    ps.ready(0.0)
    ps.finished("a", 0.1, True)
    assert ps.exhausted(0.1) == [
        ("b", "provider 's': budget of 1 calls spent (1 answered)"),
        ("c", "provider 's': budget of 1 calls spent (1 answered)"),
    ]
    assert ps.by_name["s"].failed_budget == 2 and ps.by_name["s"].entry == {}


def test_an_hourly_budget_names_when_the_next_hour_starts() -> None:
    ps = Providers((lim(name="h", rate=100.0, burst=10.0, budget_per_hour=1),))
    assert ps.arrive("a", "h", None, 2000, 0, 10.0, INF) == ""
    ps.ready(10.0)
    ps.finished("a", 20.0, True)
    prov = ps.by_name["h"]
    assert (prov.hour_start, prov.hour_spent) == (10.0, 1)
    assert ps.arrive("b", "h", None, 2000, 1, 100.4, INF) == (
        "provider 'h': budget of 1 calls per hour spent (the next hour starts in 3510 s)"
    )
    assert ps.arrive("c", "h", None, 2000, 2, 3610.0, INF) == ""
    assert prov.hour_spent == 0
    assert Providers.budget_reason(Provider(lim(name="q", budget_per_hour=0)), 7.0) == (
        "provider 'q': budget of 0 calls per hour spent (the next hour starts in 3600 s)"
    )
    late = Provider(lim(name="q", budget_per_hour=0))
    late.hour_start = 0.0
    assert Providers.budget_reason(late, 4000.0).endswith("(the next hour starts in 0 s)")


def test_with_both_budgets_the_total_is_named_once_it_is_spent() -> None:
    p = Provider(lim(name="q", budget=3, budget_per_hour=1))
    p.spent = 2
    assert Providers.budget_reason(p, 0.0).startswith("provider 'q': budget of 1 calls per hour")
    p.spent = 3
    assert Providers.budget_reason(p, 0.0) == "provider 'q': budget of 3 calls spent (3 answered)"


def test_an_hourly_budget_waits_for_in_flight_calls_and_then_fails_the_rest() -> None:
    ps = Providers((lim(name="h", rate=100.0, burst=10.0, budget_per_hour=1),))
    ps.arrive("a", "h", None, 2000, 0, 0.0, INF)
    ps.arrive("b", "h", None, 2000, 1, 0.0, INF)
    assert sent(ps.ready(0.0)) == ["a"]
    ps.finished("a", 1.0, True)
    assert ps.exhausted(1.0) == [
        ("b", "provider 'h': budget of 1 calls per hour spent (the next hour starts in 3599 s)")
    ]


def test_a_per_step_budget_charges_arrivals_and_refunds_what_was_never_answered() -> None:
    ps = Providers((lim(name="s", rate=100.0, burst=10.0, budget_per_step=2),))
    assert ps.arrive("a", "s", None, 2000, 0, 0.0, INF, step=4) == ""
    assert ps.arrive("b", "s", None, 2000, 1, 0.0, INF) == ""  # (the latest step: 4)
    assert ps.charged == {"a": ("s", 4), "b": ("s", 4)}
    assert ps.arrive("c", "s", None, 2000, 2, 0.0, INF, step=4) == (
        "provider 's': budget of 2 calls for step 4 spent (2 answered or in flight)"
    )
    assert "c" not in ps.owner and "c" not in ps.charged
    ps.ready(0.0)
    ps.finished("a", 1.0, True)  # (answered: kept)
    ps.finished("b", 1.0, False)  # (not answered: refunded)
    prov = ps.by_name["s"]
    assert prov.step_used == {4: 1} and ps.charged == {}
    assert ps.uncharge("zz", False) is None


def test_a_step_named_without_a_step_budget_is_still_counted_and_refunded() -> None:
    ps = Providers((lim(rate=100.0, burst=10.0),))
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF, step=2)
    ps.arrive("b", "p", None, 2000, 1, 0.0, INF)  # (no step, no step budget: not charged)
    assert ps.charged == {"a": ("p", 2)} and ps.by_name["p"].step_used == {2: 1}
    ps.forget("a")
    assert ps.refunded == ("p", 2) and ps.by_name["p"].step_used == {2: 0}


def test_identical_calls_coalesce_on_provider_and_key_and_cost_nothing() -> None:
    ps = Providers((lim(name="s", budget=1), lim(name="t")))
    assert ps.arrive("a", "s", "k", 2000, 0, 0.0, INF) == ""
    assert ps.arrive("b", "s", "k", 2000, 1, 0.0, INF) == ""
    assert ps.arrive("c", "t", "k", 2000, 2, 0.0, INF) == ""  # (another provider: its own)
    assert ps.arrive("d", "s", "k", 2000, 3, 0.0, INF) == ""
    assert ps.leaders == {("s", "k"): "a", ("t", "k"): "c"}
    assert ps.key_of == {"a": ("s", "k"), "c": ("t", "k")}
    assert ps.followers == {"a": ["b", "d"]} and ps.follows == {"b": "a", "d": "a"}
    assert ps.by_name["s"].coalesced == 2 and ps.by_name["t"].coalesced == 0
    assert list(ps.by_name["s"].entry) == ["a"]
    assert ps.holds("a") and ps.holds("b") and not ps.holds("zz")
    assert ps.take_followers("a") == ["b", "d"]
    assert ps.follows == {} and ps.followers == {}
    assert ps.take_followers("a") == []


def test_without_coalescing_each_identical_call_is_its_own() -> None:
    ps = Providers((lim(),), coalesce=False)
    ps.arrive("a", "p", "k", 2000, 0, 0.0, INF)
    ps.arrive("b", "p", "k", 2000, 1, 0.0, INF)
    assert ps.leaders == {} and ps.follows == {} and list(ps.by_name["p"].entry) == ["a", "b"]


def test_a_follower_that_ends_leaves_its_leader_alone() -> None:
    ps = Providers((lim(),))
    ps.arrive("a", "p", "k", 2000, 0, 0.0, INF)
    ps.arrive("b", "p", "k", 2000, 1, 0.0, INF)
    ps.arrive("c", "p", "k", 2000, 2, 0.0, INF)
    ps.forget("b")
    assert ps.followers == {"a": ["c"]} and ps.follows == {"c": "a"}
    assert ps.leaders == {("p", "k"): "a"} and ps.owner == {"a": "p"}
    assert ps.refunded is None


def test_a_waiting_leader_that_ends_is_forgotten_and_its_follower_promoted_with_its_charge() -> (
    None
):
    ps = Providers((lim(rate=100.0, burst=10.0),))
    ps.arrive("a", "p", "k", 2000, 0, 0.0, 5.0, step=3)
    ps.arrive("b", "p", "k", 2000, 1, 0.0, INF)
    ps.arrive("c", "p", "k", 2000, 2, 0.0, INF)
    ps.forget("a")
    prov = ps.by_name["p"]
    assert ps.refunded == ("p", 3) and prov.step_used == {3: 0}
    assert "a" not in ps.owner and "a" not in prov.entry and "a" not in ps.deadline
    assert ps.leaders == {} and ps.key_of == {}
    rest = ps.take_followers("a")
    assert rest == ["b", "c"]
    ps.promote("b", "p", "k", rest[1:])
    assert ps.leaders == {("p", "k"): "b"} and ps.key_of == {"b": ("p", "k")}
    assert ps.owner == {"b": "p"}
    assert ps.followers == {"b": ["c"]} and ps.follows == {"c": "b"}
    assert ps.charged == {"b": ("p", 3)} and prov.step_used == {3: 1} and ps.refunded is None
    ps.promote("c", "p", "k2", [])
    assert "c" not in ps.followers and ps.charged == {"b": ("p", 3)}


def test_an_in_flight_call_that_ends_keeps_its_slot_until_its_report() -> None:
    ps = Providers((lim(concurrency=1),))
    ps.arrive("a", "p", "k", 2000, 0, 0.0, INF)
    ps.ready(0.0)
    ps.forget("a")
    prov = ps.by_name["p"]
    assert ps.owner == {"a": "p"} and prov.inflight == {"a": 0.0}
    assert ps.leaders == {}
    assert ps.release("a") is prov
    assert prov.inflight == {} and ps.owner == {}
    assert ps.release("a") is None
    ps.forget("zz")  # (unknown: nothing)


def test_a_leader_key_taken_over_is_not_dropped_by_the_old_leader() -> None:
    ps = Providers((lim(),))
    ps.arrive("a", "p", "k", 2000, 0, 0.0, INF)
    ps.leaders[("p", "k")] = "x"
    ps.forget("a")
    assert ps.leaders == {("p", "k"): "x"} and ps.key_of == {}


def test_release_of_a_waiting_call_drops_its_tenant_only() -> None:
    ps = Providers((lim(),))
    ps.tenant_weight = lambda t: 1.0
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF, tenant="T")
    prov = ps.by_name["p"]
    assert prov.tenant_of == {"a": "T"} and prov.weight is ps.tenant_weight
    assert ps.release("a") is prov
    assert prov.tenant_of == {} and "a" in prov.entry


def test_aging_moves_a_waiter_first_and_a_deadline_times_it_out_word_for_word() -> None:
    ps = Providers((lim(rate=1.0, burst=1.0, concurrency=1),), aging_s=10.0)
    ps.arrive("x", "p", None, 2000, 0, 0.0, INF)
    ps.ready(0.0)
    ps.arrive("a", "p", None, 2009, 1, 0.0, 30.0)
    ps.arrive("b", "p", None, 2001, 2, 5.0, INF)
    prov = ps.by_name["p"]
    assert ps.due(10.0 - 2e-9) == []
    assert prov.entry["a"] == (2009, 1)
    assert ps.due(10.0 - 5e-10) == []  # (within the tolerance: a is aged)
    assert prov.entry["a"] == (0, 1)
    ps.due(15.0)
    assert prov.entry["b"] == (0, 2)
    assert prov.head() == "a"
    prov.bucket.rate = 0.123456
    assert ps.due(30.0) == [
        (
            "a",
            "provider 'p': no token and slot within the deadline "
            "(1 of 1 slots busy, rate 0.1235/s)",
        )
    ]
    assert prov.timed_out == 1 and "a" not in prov.entry
    assert ps.timers == []


def test_a_timer_of_a_call_already_sent_or_gone_is_skipped() -> None:
    ps = Providers((lim(rate=1.0, burst=1.0),), aging_s=1.0)
    ps.arrive("a", "p", None, 2000, 0, 0.0, 2.0)
    ps.arrive("b", "p", None, 2000, 1, 0.0, 2.0)
    ps.ready(0.0)  # a in flight
    ps.forget("b")
    assert ps.due(5.0) == []
    assert ps.by_name["p"].timed_out == 0 and ps.by_name["p"].inflight == {"a": 0.0}


def test_an_aged_call_is_not_pushed_again() -> None:
    ps = Providers((lim(),), aging_s=1.0)
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    ps.by_name["p"].push("a", 0, 0)
    n = len(ps.by_name["p"].heap)
    ps.due(1.0)
    assert len(ps.by_name["p"].heap) == n


def test_the_static_split_gives_each_trajectory_a_slice_interleaved_by_one_over_the_rate() -> None:
    ps = Providers(
        (lim(name="s", rate=4.0, burst=4.0, concurrency=5, decrease=0.25, max_attempts=3),),
        policy="static-split",
        trajectories=2,
    )
    assert ps.arrive("a", "s", None, 2000, 0, 0.0, INF, trajectory="t0") == ""
    assert ps.arrive("b", "s", None, 2000, 1, 0.0, INF, trajectory="t1") == ""
    assert ps.arrive("c", "s", None, 2000, 2, 0.0, INF, trajectory="t0") == ""
    assert ps.arrive("d", "s", None, 2000, 3, 0.0, INF, trajectory="t2") == ""  # (slot 0 again)
    assert ps.tslot == {"t0": 0, "t1": 1, "t2": 0}
    s0, s1 = ps.by_name["s#0"], ps.by_name["s#1"]
    assert ps.slices == [s0, s1] and (s0.slice_idx, s1.slice_idx) == (0, 1)
    assert s0.limits == ProviderLimits(
        name="s#0", rate=2.0, burst=1.0, concurrency=2, decrease=0.25, max_attempts=3
    )
    assert (s0.bucket.paused_until, s1.bucket.paused_until) == (-INF, 0.25)
    assert ps._early == pytest.approx(1e-6 + 1e-9)
    assert ps.owner == {"a": "s#0", "b": "s#1", "c": "s#0", "d": "s#0"}
    assert ps.by_name["s"].entry == {}
    out = ps.ready(0.0)
    assert out == [Dispatch("a", "s")]  # (slice 0: 1 token; slice 1 paused to 0.25)
    assert ps.wake_at == {0: 0.5, 1: 0.25}
    assert ps.next_wake(0.0) == 0.25
    assert ps.ready(0.1) == []
    assert ps.ready(0.25) == [Dispatch("b", "s")]
    assert ps.wake_at == {0: 0.5}
    assert ps.ready(0.5) == [Dispatch("c", "s")]
    assert ps.wake_at == {}  # (slice 0: 2 slots busy)
    assert ps.next_wake(0.5) == INF
    ps.finished("a", 0.6, True)
    assert ps.dirty == {0}
    assert ps.ready(0.6) == []  # (its token comes at 1.0)
    assert ps.wake_at == {0: 1.0} and ps.next_wake(0.6) == 1.0
    assert ps.ready(1.0 - 4e-10) == [Dispatch("d", "s")]  # (looked at early, within _early)


def test_the_static_split_without_a_trajectory_and_one_trajectory() -> None:
    ps = Providers((lim(name="s", rate=3.0, concurrency=7),), policy="static-split")
    ps.arrive("a", "s", None, 2000, 0, 0.0, INF)
    assert ps.tslot == {"": 0}
    s0 = ps.by_name["s#0"]
    assert (s0.limits.rate, s0.limits.concurrency, s0.bucket.paused_until) == (3.0, 7, -INF)
    big = Providers(
        (lim(name="s", rate=3.0, concurrency=2),), policy="static-split", trajectories=4
    )
    for i in range(4):
        big.arrive(str(i), "s", None, 2000, i, 0.0, INF, trajectory=str(i))
    assert [sl.limits.concurrency for sl in big.slices] == [1, 1, 1, 1]
    assert [sl.bucket.paused_until for sl in big.slices] == [-INF, 1 / 3, 2 / 3, 1.0]


def test_a_stale_slice_wake_is_dropped_by_next_wake() -> None:
    ps = Providers((lim(name="s", rate=1.0),), policy="static-split", trajectories=2)
    ps.arrive("a", "s", None, 2000, 0, 0.0, INF, trajectory="x")
    ps.arrive("b", "s", None, 2000, 1, 0.0, INF, trajectory="x")
    ps.ready(0.0)
    assert ps.wakes == [(2.0, 0)]
    ps.forget("b")
    assert ps.next_wake(0.0) == INF  # (nothing waits on slice 0 any more)
    assert ps.wakes == [] and ps.wake_at == {}
    ps.wakes = [(3.0, 0)]  # (an entry no longer live)
    assert ps.next_wake(0.0) == INF and ps.wakes == []


def test_check_reports_each_broken_invariant_word_for_word() -> None:
    ps = Providers(
        (
            lim(
                name="s",
                rate=1.0,
                burst=2.0,
                concurrency=1,
                budget=1,
                budget_per_hour=1,
                budget_per_step=1,
            ),
        )
    )
    assert ps.check({}) == []
    prov = ps.by_name["s"]
    prov.bucket.tokens = 2.5
    prov.inflight = {"a": 0.0, "b": 0.0}
    prov.spent, prov.hour_spent = 2, 3
    prov.step_used = {7: 2, 8: 1}
    ps.follows = {"f": "gone", "g": "live"}
    assert ps.check({"live": object()}) == [
        "s: tokens 2.5 outside [0, 2.0]",
        "s: 2 in flight > 1",
        "s: spent 2 > budget 1",
        "s: 3 this hour > 1",
        "s: 2 charged to step 7 > 1",
        "follower f of gone, which is not live",
    ]
    prov.bucket.tokens = -1e-10
    assert ps.check({"live": 1})[0] == "s: 2 in flight > 1"
    prov.bucket.tokens = -2e-9
    assert ps.check({"live": 1})[0] == "s: tokens -2e-09 outside [0, 2.0]"
    prov.bucket.tokens = 2.0 + 5e-10
    assert ps.check({"live": 1})[0] == "s: 2 in flight > 1"


def test_check_at_the_limits_reports_nothing() -> None:
    ps = Providers((lim(name="s", concurrency=2, budget=2, budget_per_hour=2, budget_per_step=2),))
    prov = ps.by_name["s"]
    prov.bucket.tokens = 0.0
    prov.inflight = {"a": 0.0, "b": 0.0}
    prov.spent = prov.hour_spent = 2
    prov.step_used = {1: 2}
    assert ps.check({}) == []
    free = Providers((lim(name="s"),))
    free.by_name["s"].step_used = {1: 99}
    free.by_name["s"].spent = free.by_name["s"].hour_spent = 99
    assert free.check({}) == []


def test_check_counts_tenants_calls_in_flight() -> None:
    ps = Providers((lim(name="s", rate=100.0, burst=10.0),))
    ps.tenant_weight = lambda t: 1.0
    ps.arrive("a", "s", None, 2000, 0, 0.0, INF, tenant="A")
    ps.arrive("b", "s", None, 2000, 1, 0.0, INF, tenant="B")
    ps.arrive("c", "s", None, 2000, 2, 0.0, INF)
    ps.ready(0.0)
    prov = ps.by_name["s"]
    assert prov.busy == {"A": 1, "B": 1, "": 1}
    assert ps.check({}) == []
    prov.busy["A"] = 2
    assert ps.check({}) == [
        "s: tenants' calls in flight {'A': 1, 'B': 1, '': 1} but counted {'A': 2, 'B': 1, '': 1}"
    ]


def test_check_names_a_charge_of_a_call_no_longer_live() -> None:
    ps = Providers((lim(name="s"),))
    ps.charged = {"z": ("s", 4)}
    assert ps.check({}) == ["z charged to s step 4 but not live"]


def test_stats_are_by_provider_name_sorted() -> None:
    ps = Providers((lim(name="b"), lim(name="a")))
    st = ps.stats()
    assert list(st) == ["a", "b"] and st["a"] == ps.by_name["a"].stats()


def test_check_does_not_report_a_sound_waiting_call_of_another_provider() -> None:
    ps = Providers((lim(name="a", rate=100.0, burst=10.0), lim(name="b", rate=1.0, burst=1.0)))
    assert ps.arrive("x", "a", None, 2000, 0, 0.0, INF, step=1) == ""  # (charged to a)
    assert ps.arrive("y", "b", None, 2000, 1, 0.0, INF) == ""
    assert ps.arrive("z", "b", None, 2000, 2, 0.0, INF) == ""
    ps.ready(0.0)  # (x and y in flight; z waits for b's token, owned by b)
    assert ps.owner == {"x": "a", "y": "b", "z": "b"}
    assert ps.check({}) == []  # (before 2026-11-30 it reported "a: waiting z not owned")


def test_check_reports_a_waiting_call_without_an_owner() -> None:
    ps = Providers((lim(name="a"),))
    ps.arrive("x", "a", None, 2000, 0, 0.0, INF)
    del ps.owner["x"]
    assert ps.check({}) == ["a: waiting x not owned"]


# ---- edges the first mutation run left (each kills a named mutant) --------------------------


def test_a_pause_ends_exactly_its_tolerance_before_its_time() -> None:
    b = Bucket(lim(rate=2.0, burst=1.0), now=0.0)
    b.pause(0.0, 3.0)
    edge = b.paused_until - 1e-9  # (the tolerance, computed as the bucket does)
    assert b.ready(edge)
    b2 = Bucket(lim(rate=2.0, burst=1.0), now=0.0)
    b2.pause(0.0, 3.0)
    assert b2.next_token_at(b2.paused_until - 1e-9) == b2.paused_until - 1e-9


def test_a_token_short_by_exactly_the_tolerance_is_whole() -> None:
    b = Bucket(lim(rate=1.0), now=0.0)
    b.tokens = 1.0 - 1e-9
    assert b.ready(0.0)
    b.tokens = 1.0 - 1e-9
    assert b.next_token_at(0.0) == 0.0


def test_success_within_a_second_of_the_decrease_probes_by_the_fraction() -> None:
    b = Bucket(lim(rate=10.0), now=0.0)
    b.throttled(0.0, 0.0)
    b.succeeded(0.5)
    assert b.rate == 5.5


def test_a_semaphore_given_to_the_paced_policy_is_ignored() -> None:
    ps = Providers((lim(rate=10.0, burst=3.0, concurrency=3),), semaphore=1)
    for i in range(3):
        ps.arrive(str(i), "p", None, 2000, i, 0.0, INF)
    assert sent(ps.ready(0.0)) == ["0", "1", "2"]


def test_exhausted_looks_past_a_provider_with_budget_left() -> None:
    ps = Providers((lim(name="free", rate=100.0), lim(name="s", rate=100.0, burst=5.0, budget=1)))
    ps.arrive("f", "free", None, 2000, 0, 0.0, INF)
    ps.arrive("a", "s", None, 2000, 1, 0.0, INF)
    ps.arrive("b", "s", None, 2000, 2, 0.0, INF)
    ps.ready(0.0)
    ps.finished("a", 0.1, True)
    ps.arrive("g", "free", None, 2000, 3, 0.1, INF)  # (waits: free's burst is spent)
    assert ps.exhausted(0.1) == [("b", "provider 's': budget of 1 calls spent (1 answered)")]


def test_next_wake_looks_past_a_provider_with_nothing_to_wake_for() -> None:
    for first in (
        lim(name="a", rate=1.0),  # (nothing waits)
        lim(name="a", rate=100.0, burst=5.0, budget=1),
    ):  # (its budget in flight)
        ps = Providers((first, lim(name="b", rate=4.0)))
        if first.budget:
            ps.arrive("a1", "a", None, 2000, 0, 0.0, INF)
            ps.arrive("a2", "a", None, 2000, 1, 0.0, INF)
        ps.arrive("b1", "b", None, 2000, 2, 0.0, INF)
        ps.arrive("b2", "b", None, 2000, 3, 0.0, INF)
        ps.ready(0.0)
        assert ps.next_wake(0.0) == 0.25
    ps = Providers((lim(name="a", rate=4.0, burst=1.0, budget=2),))
    ps.arrive("x", "a", None, 2000, 0, 0.0, INF)
    ps.arrive("y", "a", None, 2000, 1, 0.0, INF)
    ps.ready(0.0)  # (one of two in flight: one more may go at its token)
    assert ps.next_wake(0.0) == 0.25


def test_the_timers_of_a_forgotten_call_do_not_hold_back_the_others() -> None:
    ps = Providers((lim(rate=1.0, burst=1.0, concurrency=1),), aging_s=1.0)
    ps.arrive("x", "p", None, 2000, 9, 0.0, INF)
    ps.ready(0.0)
    ps.arrive("a", "p", None, 2009, 1, 0.0, 2.0)
    ps.arrive("b", "p", None, 2009, 0, 0.0, 2.0)
    ps.forget("a")
    prov = ps.by_name["p"]
    assert ps.due(1.0) == []
    assert prov.entry["b"] == (0, 0)  # (aged: seq 0 too)
    ps.arrive("c", "p", None, 2009, 3, 1.0, 2.0)
    out = ps.due(2.0)
    assert [aid for aid, _ in out] == ["b", "c"] and prov.timed_out == 2


def test_pauses_are_counted_each() -> None:
    ps = Providers((lim(rate=8.0),))
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    ps.ready(0.0)
    ps.throttled("a", 1.0, 1.0)
    ps.requeue("a", 2000, 0, 1.0, INF)
    ps.ready(2.0)
    assert ps.throttled("a", 2.0, 1.0).pauses == 2


def test_tenants_slots_are_given_back_by_a_429_and_by_the_end_of_a_call() -> None:
    ps = Providers((lim(rate=100.0, burst=5.0),))
    ps.tenant_weight = lambda t: 1.0
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF, tenant="A")
    ps.arrive("b", "p", None, 2000, 1, 0.0, INF, tenant="B")
    ps.ready(0.0)
    prov = ps.by_name["p"]
    assert prov.busy == {"A": 1, "B": 1}
    ps.throttled("a", 0.5, None)
    assert prov.busy == {"B": 1} and prov.tenant_of == {"a": "A", "b": "B"}
    ps.finished("b", 0.5, True)
    assert prov.busy == {} and prov.tenant_of == {"a": "A"}
    ps.requeue("a", 2000, 0, 0.5, INF)
    ps.forget("a")
    assert prov.tenant_of == {} and ps.owner == {}


def test_release_of_a_waiting_call_without_a_tenant() -> None:
    ps = Providers((lim(),))
    ps.arrive("a", "p", None, 2000, 0, 0.0, INF)
    assert ps.release("a") is ps.by_name["p"]


def test_a_promoted_follower_adds_its_charge_to_the_step_s_count() -> None:
    ps = Providers((lim(rate=100.0, burst=10.0),))
    ps.arrive("a", "p", "k", 2000, 0, 0.0, INF, step=3)
    ps.arrive("b", "p", "k", 2000, 1, 0.0, INF)
    ps.arrive("c", "p", None, 2000, 2, 0.0, INF, step=3)
    ps.forget("a")
    assert ps.by_name["p"].step_used == {3: 1}
    ps.promote("b", "p", "k", ps.take_followers("a")[1:])
    assert ps.by_name["p"].step_used == {3: 2}


def test_a_slice_whose_waiters_left_forgets_its_wake() -> None:
    ps = Providers((lim(name="s", rate=1.0),), policy="static-split", trajectories=2)
    ps.arrive("a", "s", None, 2000, 0, 0.0, INF, trajectory="x")
    ps.arrive("b", "s", None, 2000, 1, 0.0, INF, trajectory="x")
    ps.ready(0.0)
    assert ps.wake_at == {0: 2.0}
    ps.forget("b")
    ps.finished("a", 0.5, True)
    assert ps.ready(0.5) == [] and ps.wake_at == {}


def test_check_at_exactly_the_tolerance_of_the_bucket_s_bounds() -> None:
    ps = Providers((lim(name="s", burst=2.0),))
    prov = ps.by_name["s"]
    prov.bucket.tokens = -1e-9
    assert ps.check({}) == []
    prov.bucket.tokens = 2.0 + 1e-9
    assert ps.check({}) == []
