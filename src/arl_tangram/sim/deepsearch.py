"""The ``deep-search`` workload (issue 37): search agents trained with RL calling a rate-limited
web-search provider, simulated on the production core under tangram's provider scheduling and the
baselines training stacks deploy, with a lower bound beside them.

Sources (repeated in docs/workloads.md, "deep-search"):

- Search-R1 (Jin et al. 2025, arXiv 2503.09516; its training scripts): a train batch of 512
  prompts x 5 rollouts (GRPO group size 5) = 2,560 trajectories per step, at most 4 turns
  (``max_turns=4``), each turn a generation then at most one search, topk 3.
- ASearcher (Gao et al. 2025, arXiv 2508.07976): trajectories of over 40 tool calls; its code
  guards search with a semaphore of 20 and fetch with 10 per process.
- verl's search tool (``verl.tools.search_tool.SearchTool``): ``num_workers: 120``,
  ``rate_limit: 120`` (a semaphore), no pacing, a 429 not retried.
- Serper: 50 to 300 queries/s by plan, no Retry-After; Tavily: 100 or 1,000 requests/min;
  Jina Reader: 20 / 500 / 5,000 requests/min, ~8 s average fetch (the providers' pricing pages,
  as quoted in issue 37; not re-checked here).
- Query repetition: siblings of a GRPO group answer the same prompt, so their first searches
  often repeat it (issue 37: "often issue the same query"; only DeepResearcher caches queries,
  for 7 days). The share is an assumption: ``--same`` (default 0.5 for the first turn, 0.2 after).
- Search latency: lognormal, median 1.0 s (assumption: a SERP API round trip), clamped to
  [0.2, 10] s. Generation between turns: ~150 tokens median at 40 tok/s (workloads.DECODE_TOK_S).

The provider is a model with real limits (`VirtualProvider`): a token bucket of ``rate``/s and
``burst``, ``concurrency`` calls at once, a 429 without headers past either (after ``rtt``).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..core import commands as C
from ..core import events as E
from ..core.actions import ActionKind, Status
from ..core.build import make_finished
from ..core.cluster import ClusterSpec, NodeSpec
from ..core.config import CoreConfig
from ..core.core import Core
from ..core.providers import ProviderLimits
from ..core.resources import Resources
from .simulator import Simulator
from .trace import SimAction, Trajectory
from .workloads import gen_seconds, lognormal

SEARCH_R1_TRAJECTORIES = 2560  # 512 prompts x 5 (Search-R1's GRPO setting)
GROUP = 5  # GRPO group size (Search-R1)
MAX_TURNS = 4  # Search-R1's max_turns
SERPER_RATE = 50.0  # Serper's lowest plan, queries/s
VERL_SEMAPHORE = 120  # verl's search tool num_workers / rate_limit
POLICIES = ("tangram", "tangram-no-coalesce", "semaphore", "static-split")


@dataclass
class VirtualProvider:
    """A provider with real limits in virtual time; answers a call after its true latency
    (the action's ``work_s``) or 429 (no headers) after ``rtt`` when over its limits."""

    rate: float
    burst: float
    concurrency: int
    rtt: float = 0.05
    tokens: float = field(init=False)
    t: float = 0.0
    inflight: int = 0
    answered: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def call(self, executor: Any, cmd: C.CallProvider) -> None:
        now = executor.loop.now
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        aid = cmd.action.id
        if self.tokens < 1.0 - 1e-9 or self.inflight >= self.concurrency:
            self.rejected += 1
            executor._report(self.rtt, lambda t: E.ProviderThrottled(t, aid, None, "HTTP 429"))
            return
        self.tokens -= 1.0
        self.inflight += 1
        truth = executor.truth.get(aid)
        latency = truth.work_s if truth is not None else 0.0

        def done(t: float) -> E.Event:
            self.inflight -= 1
            self.answered += 1
            return make_finished(t, aid, Status.SUCCEEDED, {"provider": cmd.provider}, "", latency)
        executor._report(latency, done)


def deep_search(rng: random.Random, index: int, *, group: int = GROUP, turns: int = MAX_TURNS,
                same_first: float = 0.5, same_later: float = 0.2, provider: str = "serper",
                ) -> Trajectory:
    """One Search-R1 rollout: 1..turns turns, each a generation then a search (the group's
    siblings share the prompt, and with some probability the query)."""
    prompt = index // group
    steps = []
    for t in range(rng.randint(1, turns)):
        same = rng.random() < (same_first if t == 0 else same_later)
        q = f"p{prompt}-t{t}" if same else f"p{prompt}-r{index}-t{t}"
        act = SimAction(kind=ActionKind.SEARCH, work_s=lognormal(rng, 1.0, 0.6, 0.2, 10.0),
                        demand=Resources(), tag=provider, timeout_s=600.0, query=q)
        steps.append((gen_seconds(rng, 150, 0.6, 1000), act))
    return Trajectory(f"ds-{index}", "deep-search", tuple(steps))


@dataclass
class Outcome:
    policy: str
    calls: int  # search actions delivered
    succeeded: int
    failed: int
    act_avg_s: float
    bound_act_avg_s: float
    provider_calls: int
    provider_429s: int
    coalesced: int
    cache_hits: int
    makespan_s: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run(policy: str, *, trajectories: int = SEARCH_R1_TRAJECTORIES, seed: int = 0,
        rate: float = SERPER_RATE, burst: float = SERPER_RATE, concurrency: int = VERL_SEMAPHORE,
        semaphore: int = VERL_SEMAPHORE, cache_ttl_s: float = 0.0, same_first: float = 0.5,
        ) -> Outcome:
    """One RL step's rollouts of ``trajectories`` search agents under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"policy: one of {', '.join(POLICIES)}, got {policy!r}")
    rng = random.Random(seed)
    trajs = [deep_search(rng, i, same_first=same_first) for i in range(trajectories)]
    cluster = ClusterSpec((NodeSpec("cpu-0", Resources(cpu=8, memory_mb=32768), pool="cpu"),), ())
    limits = ProviderLimits(name="serper", rate=rate, burst=burst, concurrency=concurrency,
                            max_attempts=1000)
    name = "tangram" if policy.startswith("tangram") else policy
    core = Core(cluster, CoreConfig(providers=(limits,), provider_policy=name,
                                    provider_semaphore=semaphore, trajectories=trajectories,
                                    provider_coalesce=policy == "tangram"))
    sim = Simulator(cluster, core, policy=policy, workload="deep-search", seed=seed)
    sim.cache_ttl_s = cache_ttl_s if policy == "tangram" else 0.0
    vp = VirtualProvider(rate, burst, concurrency)
    sim.executor.providers["serper"] = vp
    rep = sim.run([trajs])
    by = {str(k): v for k, v in rep.by_status.items()}
    p = core.providers.by_name["serper"]
    return Outcome(policy, rep.actions, by.get("succeeded", 0), by.get("failed", 0),
                   round(float(rep.act.get("avg", 0.0)), 4), round(_bound(sim), 4),
                   vp.answered + vp.rejected, vp.rejected, p.coalesced, sim.cache_hits,
                   round(rep.makespan_s, 3))


def run_burst(policy: str, *, calls: int = 2000, trajectories: int = 100, rate: float = 50.0,
              burst: float = 50.0, concurrency: int = 16, latency_s: float = 0.2,
              declared_burst: float = 10.0) -> Outcome:
    """The acceptance burst, simulated: ``calls`` distinct searches at once (the static split
    cuts the limits into ``trajectories`` slices) against a provider of ``rate``/s, ``burst``
    and ``concurrency`` taking ``latency_s`` per answer; tangram declares ``declared_burst``.
    The bound: each call's earliest finish under the provider's own limits."""
    if policy not in POLICIES:
        raise ValueError(f"policy: one of {', '.join(POLICIES)}, got {policy!r}")
    act = [SimAction(kind=ActionKind.SEARCH, work_s=latency_s, demand=Resources(), tag="serper",
                     timeout_s=600.0, query=f"q{i}") for i in range(calls)]
    # every call arrives at 0 (one trajectory each: the static split's slices take them
    # round robin, ``trajectories`` slices)
    trajs = [Trajectory(f"b-{i}", "burst", ((0.0, act[i]),)) for i in range(calls)]
    cluster = ClusterSpec((NodeSpec("cpu-0", Resources(cpu=8, memory_mb=32768), pool="cpu"),), ())
    limits = ProviderLimits(name="serper", rate=rate, burst=declared_burst, concurrency=concurrency,
                            max_attempts=1000)
    name = "tangram" if policy.startswith("tangram") else policy
    core = Core(cluster, CoreConfig(providers=(limits,), provider_policy=name,
                                    provider_semaphore=concurrency, trajectories=trajectories))
    sim = Simulator(cluster, core, policy=policy, workload="burst")
    vp = VirtualProvider(rate, burst, concurrency)
    sim.executor.providers["serper"] = vp
    rep = sim.run([trajs])
    by = {str(k): v for k, v in rep.by_status.items()}
    p = core.providers.by_name["serper"]
    b = statistics.fmean(max(max(0.0, (k - burst + 1) / rate), (k // concurrency) * latency_s)
                         + latency_s for k in range(calls))
    return Outcome(policy, rep.actions, by.get("succeeded", 0), by.get("failed", 0),
                   round(float(rep.act.get("avg", 0.0)), 4), round(b, 4),
                   vp.answered + vp.rejected, vp.rejected, p.coalesced, 0,
                   round(rep.makespan_s, 3))


def _bound(sim: Simulator) -> float:
    """A lower bound on the mean ACT of this run's calls on their own release times: each call
    takes at least its latency; the provider admits at most ``burst + rate t`` calls by time t,
    so the k-th distinct query released (FIFO over release times, which minimizes the sum of
    start times of equal-cost grants) starts no earlier than the bucket lets it; a call whose
    query was released before takes no token and is charged the time to that first call's
    earliest finish, or 0 past it (it could join that call, or a later identical one).
    The concurrency cap is left out (a weaker bound where it binds). Without the cache (a cache hit is not charged here: run it with
    ``cache_ttl_s=0`` for a bound that holds)."""
    log = sim.calls_log
    return statistics.fmean(_bound_terms(log, sim)) if log else 0.0


def _bound_terms(log: list[tuple[float, float, str]], sim: Simulator) -> list[float]:
    vp = sim.executor.providers["serper"]
    rate, burst = vp.rate, vp.burst
    out: list[float] = []
    tokens, t_last = burst, 0.0
    open_until: dict[str, float] = {}
    for release, latency, q in sorted(log):
        joined = open_until.get(q)
        if joined is not None:  # (it could join the identical call, or a later one, in flight)
            out.append(max(0.0, joined - release))
            continue
        tokens = min(burst, tokens + (release - t_last) * rate)
        t_last = release
        if tokens >= 1.0:
            start = release
            tokens -= 1.0
        else:
            start = release + (1.0 - tokens) / rate
            tokens = 0.0
            t_last = start
        open_until[q] = start + latency
        out.append(start - release + latency)
    return out



def main(argv: list[str] | None = None) -> int:
    """``python -m arl_tangram.sim.deepsearch [--trajectories N] [--seed S] [--cache-ttl-s T]``:
    every policy on one RL step of deep-search, as JSON lines and a table."""
    import argparse
    import json

    p = argparse.ArgumentParser(description="the deep-search workload under every provider policy")
    p.add_argument("--trajectories", type=int, default=SEARCH_R1_TRAJECTORIES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-ttl-s", type=float, default=600.0, help="(the tangram+cache row)")
    p.add_argument("--policies", default=",".join(POLICIES))
    a = p.parse_args(argv)
    rows = [run(pol, trajectories=a.trajectories, seed=a.seed) for pol in a.policies.split(",")]
    rows.append(run("tangram", trajectories=a.trajectories, seed=a.seed, cache_ttl_s=a.cache_ttl_s))
    rows[-1].policy = f"tangram+cache{a.cache_ttl_s:g}s"
    for r in rows:
        print(json.dumps(r.as_dict()))
    print(f"{'policy':<22} {'ok':>6} {'failed':>6} {'ACT avg':>8} {'bound':>7} {'calls':>6} "
          f"{'429s':>6} {'coalesced':>9} {'cache':>6}")
    for r in rows:
        print(f"{r.policy:<22} {r.succeeded:>6} {r.failed:>6} {r.act_avg_s:>8.3f} "
              f"{r.bound_act_avg_s:>7.3f} {r.provider_calls:>6} {r.provider_429s:>6} "
              f"{r.coalesced:>9} {r.cache_hits:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
