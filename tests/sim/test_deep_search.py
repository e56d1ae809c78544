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


# ---- the search-and-fetch workload of `tangram simulate` ----------------------------------------
def test_the_providers_published_limits_and_the_semaphores_are_the_sourced_ones() -> None:
    from arl_tangram.sim.deepsearch import JINA_READER, TAVILY

    assert (TAVILY.per_min, TAVILY.mean_s, TAVILY.semaphore) == (1000, 2.5, 20)
    assert (JINA_READER.per_min, JINA_READER.mean_s, JINA_READER.semaphore) == (500, 7.9, 10)
    lim = JINA_READER.limits("tangram")
    assert (lim.burst, lim.concurrency) == (500, 500)  # a minute's requests; rate x 60 s
    assert JINA_READER.limits("semaphore").concurrency == 10
    assert (TAVILY.limits("semaphore-little").concurrency, JINA_READER.little) == (42, 66)


@pytest.fixture(scope="module")
def search_fetch() -> dict[str, object]:
    from arl_tangram.sim.deepsearch import COMPARE, DEEP_SEARCH, simulate

    n = 400  # (static-split: one slice per trajectory, a few seconds)
    return {p: simulate(DEEP_SEARCH.cluster(n), DEEP_SEARCH.batches(0, n, 1), p) for p in COMPARE}


def test_search_and_fetch_under_each_policy(search_fetch: dict) -> None:
    from arl_tangram.sim.deepsearch import DEEP_SEARCH

    batch = next(DEEP_SEARCH.batches(0, 400, 1))
    kinds = [a.tag for t in batch for _g, a in t.steps]
    assert (len(kinds), kinds.count("tavily"), kinds.count("jina")) == (1522, 1018, 504)
    t, models = search_fetch["tangram"]
    assert dict(t.by_status) == {"succeeded": 1522}
    assert {n: m.rejected for n, m in models.items()} == {"tavily": 0, "jina": 0}  # no 429
    for name, (rep, _m) in search_fetch.items():
        assert rep.act["avg"] >= rep.bound["act_avg"] - 1e-9, name  # the bound holds
        if name != "tangram":
            assert rep.act["avg"] > t.act["avg"], name  # tangram's mean ACT is the lowest
    _rep, sm = search_fetch["semaphore"]
    assert sm["jina"].rejected == 0  # (ASearcher's 10 fetches in flight never reach the rate)


def test_tangram_simulate_compares_deep_search_with_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from arl_tangram.cli.main import main

    assert main(["simulate", "--workload", "deep-search", "--compare", "--trajectories", "200",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["reports"]) == ["tangram", "semaphore", "semaphore-little", "static-split"]
    assert set(out["ratios"]) == {"semaphore", "semaphore-little", "static-split"}
    assert out["best_static"] is None
    lowest = min(r["bound"]["act_avg"] for r in out["reports"].values())
    assert out["bound"]["act_avg"] == lowest
    assert main(["simulate", "--workload", "deep-search", "--policy", "fifo"]) == 2
    assert main(["simulate", "--workload", "deep-search", "--savings"]) == 2
    assert main(["simulate", "--workload", "code-rl", "--policy", "semaphore"]) == 2
