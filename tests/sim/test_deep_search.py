"""The deep-search workload (issue 37 item 6): provider calls of search agents under tangram's
provider scheduling and the baselines, on the production core, against a provider model with
real limits (a 429 without headers past 50/s). Exact outcomes of seeded runs."""

from __future__ import annotations

import pytest

from arl_tangram.sim.deepsearch import POLICIES, run

N = 400  # trajectories: ~1,000 calls in ~40 s of virtual time, past the provider's 50/s at peak


@pytest.fixture(scope="module")
def outcomes() -> dict[str, object]:
    return {p: run(p, trajectories=N) for p in POLICIES
            if p != "static-split"}


def test_tangram_sends_no_call_the_provider_refuses_and_the_bound_holds(outcomes: dict) -> None:
    t = outcomes["tangram"]
    assert (t.failed, t.provider_429s) == (0, 0) and t.succeeded == t.calls
    assert t.provider_calls + t.coalesced == t.calls
    assert t.act_avg_s >= t.bound_act_avg_s - 1e-6  # the bound holds
    assert (t.calls, t.provider_calls, t.coalesced) == (1048, 998, 50)  # (seed 0)


def test_coalescing_saves_calls_and_time(outcomes: dict) -> None:
    t, n = outcomes["tangram"], outcomes["tangram-no-coalesce"]
    assert t.coalesced > 0 and n.coalesced == 0 and n.provider_calls == n.calls
    assert t.provider_calls < n.provider_calls and t.act_avg_s < n.act_avg_s


def test_the_semaphore_baseline_loses_calls_to_429s(outcomes: dict) -> None:
    s = outcomes["semaphore"]
    assert s.provider_429s > 0 and s.failed == s.provider_429s
    assert s.succeeded + s.failed == s.calls


def test_a_cache_answers_repeated_queries_without_a_call() -> None:
    c = run("tangram", trajectories=N, cache_ttl_s=600.0)
    t = run("tangram", trajectories=N)
    assert c.cache_hits > 0 and c.provider_calls + c.coalesced + c.cache_hits == c.calls
    assert c.provider_calls < t.provider_calls


def test_the_acceptance_burst_simulated_leaves_at_the_limit_with_no_429() -> None:
    from arl_tangram.sim.deepsearch import run_burst

    t = run_burst("tangram", calls=500)
    # 10 calls at once (the declared burst), then 50/s: the last leaves at 9.8 s, done at 10.0
    assert (t.succeeded, t.provider_429s, t.makespan_s) == (500, 0, 10.0)
    assert t.act_avg_s >= t.bound_act_avg_s
    s = run_burst("semaphore", calls=500)
    assert s.provider_429s > 0 and s.failed == s.provider_429s
    st = run_burst("static-split", calls=500)
    assert st.provider_429s == 0 and st.act_avg_s >= t.act_avg_s
