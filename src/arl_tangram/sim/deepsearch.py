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

The ``deep-search`` workload of `tangram simulate` (`DEEP_SEARCH`, `run_report`) adds page
fetches (ASearcher's agents search, then read pages) on two providers at their published
limits: search on Tavily (1,000 requests/min, a production key: docs.tavily.com, "Rate
Limits"), fetch on Jina Reader (500 requests/min with a free or paid key, 7.9 s average
latency: jina.ai's rate-limit table). Neither publishes a burst (taken as a whole minute's requests: the loosest reading, which favours the unpaced baselines) or
a concurrency cap (none), nor does Tavily publish a latency: the search latency is the only one
a search provider publishes, Jina's s.jina.ai, 2.5 s average (the same table). Each number and
assumption is in docs/workloads.md, "deep-search".
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Sequence
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
from .metrics import SimReport
from .simulator import SimConfig, Simulator
from .trace import SimAction, Trajectory
from .workloads import Workload, cpu_nodes, gen_seconds, lognormal

SEARCH_R1_TRAJECTORIES = 2560  # 512 prompts x 5 (Search-R1's GRPO setting)
GROUP = 5  # GRPO group size (Search-R1)
MAX_TURNS = 4  # Search-R1's max_turns
SERPER_RATE = 50.0  # Serper's lowest plan, queries/s
VERL_SEMAPHORE = 120  # verl's search tool num_workers / rate_limit
POLICIES = ("tangram", "tangram-no-coalesce", "semaphore", "static-split")

# ---- the search-and-fetch workload (`tangram simulate --workload deep-search`) ----------------
LATENCY_SIGMA = 0.6  # lognormal spread of a provider's latency (assumption, as search above)
LATENCY_MAX_S = 60.0  # latencies clamped to [0.2, 60] s (assumption)
FETCH_SHARE = 0.5  # a search is followed by a fetch of one of its top 3 results (assumption)


@dataclass(frozen=True, slots=True)
class SimProvider:
    """A provider of the workload at its published limits (docs/workloads.md)."""

    name: str
    kind: ActionKind
    per_min: int  # requests per minute it admits (published)
    mean_s: float  # its average latency
    semaphore: int  # ASearcher's per-process semaphore for this tool (the semaphore baseline)

    @property
    def little(self) -> int:
        """A semaphore sized by Little's law: the calls in flight at the published rate and
        mean latency (``semaphore-little``: the semaphore at its best, no slot left idle below
        the rate)."""
        return math.ceil(self.per_min * self.mean_s / 60)

    @property
    def rate(self) -> float:
        return self.per_min / 60.0

    @property
    def burst(self) -> float:
        """None is published for a per-minute limit: a whole minute's requests at once (the
        loosest reading, the one that favours the unpaced baselines)."""
        return float(self.per_min)

    def limits(self, policy: str) -> ProviderLimits:
        """What the core is told: the published rate and `burst`; no cap is published, so
        the slots never bind below the rate (rate x the longest latency), except under the
        semaphore baseline, which has ASearcher's semaphore."""
        conc = (self.semaphore if policy == "semaphore" else self.little
                if policy == "semaphore-little" else math.ceil(self.per_min * LATENCY_MAX_S / 60))
        return ProviderLimits(name=self.name, rate=self.rate, burst=self.burst, concurrency=conc,
                              max_attempts=1000)

    def latency(self, rng: random.Random) -> float:
        """Lognormal with mean ``mean_s`` (median = mean / exp(sigma^2 / 2)), clamped."""
        median = self.mean_s / math.exp(LATENCY_SIGMA ** 2 / 2)
        return lognormal(rng, median, LATENCY_SIGMA, 0.2, LATENCY_MAX_S)


TAVILY = SimProvider("tavily", ActionKind.SEARCH, 1000, 2.5, 20)
JINA_READER = SimProvider("jina", ActionKind.FETCH, 500, 7.9, 10)
SEARCH_FETCH = (TAVILY, JINA_READER)
# `tangram simulate --workload deep-search`: its policies, and those `--compare` runs
SEARCH_FETCH_POLICIES = (*POLICIES, "semaphore-little")
COMPARE = ("tangram", "semaphore", "semaphore-little", "static-split")


def search_agent(rng: random.Random, step: int, index: int) -> Trajectory:
    """One search agent's rollout: 1..4 turns (Search-R1's ``max_turns``), each a generation
    then a search; after a search, with probability ``FETCH_SHARE``, a generation then a fetch
    of one of its top 3 results. Siblings of a GRPO group share the prompt and sometimes the
    query (as `deep_search`), so their fetches may repeat too."""
    prompt = index // GROUP
    steps: list[tuple[float, SimAction]] = []
    for t in range(rng.randint(1, MAX_TURNS)):
        same = rng.random() < (0.5 if t == 0 else 0.2)
        q = f"s{step}-p{prompt}-t{t}" if same else f"s{step}-p{prompt}-r{index}-t{t}"
        steps.append((gen_seconds(rng, 150, 0.6, 1000), SimAction(
            kind=ActionKind.SEARCH, work_s=TAVILY.latency(rng), demand=Resources(), tag=TAVILY.name,
            timeout_s=600.0, query=q)))
        if rng.random() < FETCH_SHARE:
            url = f"{q}/r{rng.randrange(3)}"
            steps.append((gen_seconds(rng, 150, 0.6, 1000), SimAction(
                kind=ActionKind.FETCH, work_s=JINA_READER.latency(rng), demand=Resources(),
                tag=JINA_READER.name, timeout_s=600.0, query=url)))
    return Trajectory(f"s{step}-ds-{index}", "deep-search", tuple(steps), 0.0, {}, step)


DEEP_SEARCH = Workload(
    "deep-search", "search agents calling a web-search and a page-fetch provider at their "
    "published rate limits (issue 37; provider policies: tangram, semaphore, static-split)",
    ((search_agent, 1.0),), lambda n: ClusterSpec(tuple(cpu_nodes("cpu", 8))),
    trajectories=SEARCH_R1_TRAJECTORIES, steps=1, train_s=0.0)
PROVIDER_WORKLOADS = {DEEP_SEARCH.name: DEEP_SEARCH}


class _CallSimulator(Simulator):
    """The simulator, keeping each provider call's release, latency, query and outcome for
    the run's bound (`provider_bound`)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        # (provider, submit, true latency, query, status, timeout) of each delivered call
        self.delivered: list[tuple[str, float, float, str, Status, float]] = []

    def _deliver(self, result: Any) -> None:
        act = self.truth.get(result.id)
        if isinstance(act, SimAction) and act.query is not None and act.tag is not None:
            self.delivered.append((act.tag, result.submit_time, act.work_s, act.query,
                                   result.status, act.timeout_s))
        super()._deliver(result)


def provider_bound(calls: Iterable[tuple[str, float, float, str, Status, float]],
                   providers: Sequence[SimProvider], count: int) -> float:
    """A lower bound on a run's mean ACT over its ``count`` counted actions, on its own
    release times: per provider, its answered calls under its bucket (`bucket_terms`: the k-th
    distinct query released starts no earlier than the bucket lets it, a repeated one may
    join); a call that timed out its timeout (it waited that long); a failed one 0."""
    calls = list(calls)
    total = sum(t for *_x, st, t in calls if st is Status.TIMED_OUT)
    for p in providers:
        log = [(rel, lat, q) for tag, rel, lat, q, st, _t in calls
               if tag == p.name and st is Status.SUCCEEDED]
        total += sum(bucket_terms(log, p.rate, p.burst))
    return total / count if count else 0.0


def run_report(cluster: ClusterSpec, batches: Iterable[Sequence[Trajectory]], policy: str, *,
               seed: int = 0, workload: str = "deep-search", config: SimConfig | None = None,
               providers: Sequence[SimProvider] = SEARCH_FETCH) -> SimReport:
    """One run of a provider workload under ``policy`` (one of `POLICIES`), as `tangram
    simulate` reports it: the run's bound is `provider_bound` (each call's latency under its
    provider's bucket), not the node pools'."""
    return simulate(cluster, batches, policy, seed=seed, workload=workload, config=config,
                    providers=providers)[0]


def simulate(cluster: ClusterSpec, batches: Iterable[Sequence[Trajectory]], policy: str, *,
             seed: int = 0, workload: str = "deep-search", config: SimConfig | None = None,
             providers: Sequence[SimProvider] = SEARCH_FETCH,
             ) -> tuple[SimReport, dict[str, VirtualProvider]]:
    """`run_report`, and the provider models after the run (their answers and 429s)."""
    if policy not in SEARCH_FETCH_POLICIES:
        raise KeyError(f"unknown policy {policy!r} for a provider workload; known: "
                       f"{', '.join(SEARCH_FETCH_POLICIES)}")
    it = iter(batches)
    first = list(next(it, []))
    name = "tangram" if policy.startswith("tangram") else policy.removesuffix("-little")
    core = Core(cluster, CoreConfig(providers=tuple(p.limits(policy) for p in providers),
                                    provider_policy=name, trajectories=max(1, len(first)),
                                    provider_coalesce=policy == "tangram"))
    sim = _CallSimulator(cluster, core, config, policy=policy, workload=workload, seed=seed)
    for p in providers:
        sim.executor.providers[p.name] = VirtualProvider(p.rate, p.burst, 10**9)
    rep = sim.run(itertools.chain((first,), it))
    counted = sum(v for k, v in rep.by_status.items() if str(k) in ("succeeded", "failed", "timed_out"))
    b = provider_bound(sim.delivered, providers, counted)
    # (the node pools' bound charges each call its own latency, which a coalesced call need
    # not wait: only the provider bound holds here)
    models = {p.name: sim.executor.providers[p.name] for p in providers}
    return dataclasses.replace(rep, bound={**(rep.bound or {}), "act_avg": b,
                                           "provider_act_avg": b}), models


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
    return bucket_terms(log, vp.rate, vp.burst)


def bucket_terms(log: Iterable[tuple[float, float, str]], rate: float, burst: float) -> list[float]:
    """Each call's least completion time, (release, latency, query) in, under a bucket of
    ``rate``/s and ``burst`` (`_bound`)."""
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
