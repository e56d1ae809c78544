"""Provider quotas as capacity: token buckets, slots and budgets, and the order of the waiting.

A provider (a web-search or page-fetch API, or any HTTP service with limits) is a resource like
the cores of a node: its limits are a token bucket (``rate`` requests per second, ``burst``
tokens), a number of concurrent calls (``concurrency`` slots) and an optional ``budget`` of
calls. A ``search`` / ``fetch`` / ``http`` action names its provider in its ``tag``; it waits
here, not in a worker, for a token and a slot, in the same order as every other action of the
core (expected work / weight in half-octave classes, FIFO inside a class, aged actions first),
and leaves as a `CallProvider` command. Pure: time arrives with the events; when the next token
appears later than now, the core asks its driver to be woken then (`WakeAt`).

Theory. The token bucket is the (sigma, rho) regulator of Cruz (1991), "A calculus for network
delay", and the leaky bucket of Turner (1986): in any interval of length t at most
``burst + rate * t`` calls leave. Within that envelope the waiting calls are served shortest
expected first (SRPT, Schrage 1968; with estimates, as `queues.Queues.rank`), which minimizes
the mean completion time among work-conserving orders of one server. A provider that answers
429 without telling its limit is probed as TCP probes a path (Jacobson 1988; Chiu and Jain 1989,
AIMD): a 429 multiplies the rate by ``decrease`` (once per round: calls sent before the last
decrease do not decrease it again), each success adds ``probe_per_s`` requests/s per second
elapsed since the last change, up to the configured rate. ``Retry-After`` pauses the bucket
until then (RFC 9110 10.2.3), with no token before it.

Invariants (`check`): tokens in [0, burst]; in-flight calls <= concurrency; budget spent <=
budget; every waiting action is QUEUED, every in-flight one STARTING/RUNNING or already ended
(its slot held until the manager's report), every follower of a coalesced call has a live
leader.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .actions import ActionKind

PROVIDER_KINDS = (ActionKind.SEARCH, ActionKind.FETCH, ActionKind.HTTP)
# How provider calls are scheduled (`CoreConfig.provider_policy`): ours, and the two baselines
# of what training stacks deploy (docs/search.md, "Baselines"):
# - "semaphore": verl's search tool / ASearcher: a per-process semaphore of `provider_semaphore`
#   slots (default the provider's concurrency), no pacing, FIFO, a 429 fails the call at once;
# - "static-split": each trajectory owns rate / T requests/s (burst 1, the slices' tokens
#   interleaved) and concurrency / T slots (at least 1) for its life (T =
#   `CoreConfig.trajectories`); a 429 waits for its own next token.
PROVIDER_POLICIES = ("tangram", "semaphore", "static-split")
_EPS = 1e-9
_SQRT_HALF = math.sqrt(0.5)
_AGED = 0  # the rank of an aged action: before every class


def _bad(name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"{name}: {rule}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderLimits:
    """One provider's limits, as the core schedules them (the service config's ``providers``
    entry, less its URL and keys, which the core never sees)."""

    name: str
    rate: float  # tokens per second (the config may say per minute: divided by 60 there)
    burst: float = 1.0  # bucket size: calls that may leave at once after a quiet spell
    concurrency: int = 16  # calls in flight at once
    budget: int | None = None  # calls the provider may answer in total (None: unbounded)
    # calls it may answer per hour: fixed windows of 3,600 s from its first call (None: any)
    budget_per_hour: int | None = None
    # calls per RL step (the action's ``payload["step"]``, else the latest step the provider
    # saw): each admitted call is charged at arrival, refunded if the provider never answers it;
    # the call past it fails at once (None: unbounded; a call naming its step is still counted
    # and refunded, so ``step_used`` reads the same either way)
    budget_per_step: int | None = None
    decrease: float = 0.5  # a 429 without Retry-After multiplies the rate by this
    min_rate: float | None = None  # the rate never falls below this (None: rate / 64)
    probe_per_s: float | None = None  # additive increase, req/s per second (None: rate / 10)
    max_attempts: int = 8  # a call answered 429 this many times fails with the reason

    def __post_init__(self) -> None:
        p = f"providers[{self.name!r}]"
        if not isinstance(self.name, str) or not self.name:
            raise _bad("providers[].name", self.name, "must be a non-empty string")
        for field, v, lo in (("rate", self.rate, 0.0), ("burst", self.burst, 1.0)):
            if not isinstance(v, int | float) or math.isnan(v) or math.isinf(v) or v < lo or v == 0:
                raise _bad(f"{p}.{field}", v, f"must be a finite number >= {lo:g} and > 0")
        if not isinstance(self.concurrency, int) or isinstance(self.concurrency, bool) or self.concurrency < 1:
            raise _bad(f"{p}.concurrency", self.concurrency, "must be an integer >= 1")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 0):
            raise _bad(f"{p}.budget", self.budget, "must be an integer >= 0 or None")
        for field, b in (("budget_per_hour", self.budget_per_hour),
                         ("budget_per_step", self.budget_per_step)):
            if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0):
                raise _bad(f"{p}.{field}", b, "must be an integer >= 0 or None")
        if not (isinstance(self.decrease, int | float) and 0.0 < self.decrease < 1.0):
            raise _bad(f"{p}.decrease", self.decrease, "must be in (0, 1)")
        if self.min_rate is not None and not (0.0 < self.min_rate <= self.rate):
            raise _bad(f"{p}.min_rate", self.min_rate, f"must be in (0, rate={self.rate:g}]")
        if self.probe_per_s is not None and not (self.probe_per_s >= 0.0 and math.isfinite(self.probe_per_s)):
            raise _bad(f"{p}.probe_per_s", self.probe_per_s, "must be a finite number >= 0")
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise _bad(f"{p}.max_attempts", self.max_attempts, "must be an integer >= 1")

    @property
    def floor(self) -> float:
        return self.min_rate if self.min_rate is not None else self.rate / 64.0

    @property
    def probe(self) -> float:
        return self.probe_per_s if self.probe_per_s is not None else self.rate / 10.0


class Bucket:
    """A token bucket whose rate AIMD adjusts, with a pause (Retry-After)."""

    __slots__ = ("changed", "last_decrease", "limits", "paused_until", "rate", "t", "tokens")

    def __init__(self, limits: ProviderLimits, now: float = 0.0) -> None:
        self.limits = limits
        self.rate = float(limits.rate)  # the rate now (<= limits.rate)
        self.tokens = float(limits.burst)  # full at the start
        self.t = now  # when `tokens` was last brought up to date
        self.paused_until = -math.inf
        self.last_decrease = -math.inf  # calls sent before it do not decrease again
        self.changed = now  # last change of the rate (additive increase counts from it)

    def refill(self, now: float) -> None:
        if now > self.t:
            start = self.t if self.t > self.paused_until else min(now, self.paused_until)
            if now > start:
                self.tokens = min(float(self.limits.burst), self.tokens + self.rate * (now - start))
            self.t = now

    def ready(self, now: float) -> bool:
        """A token is there now (and no pause)."""
        if now < self.paused_until - _EPS:
            return False
        self.refill(now)
        return self.tokens >= 1.0 - _EPS

    def take(self) -> None:
        self.tokens = max(0.0, self.tokens - 1.0)

    def next_token_at(self, now: float) -> float:
        """When the next whole token is there (``now`` if it is)."""
        if now < self.paused_until - _EPS:
            return self.paused_until + max(0.0, 1.0 - self.tokens) / self.rate
        self.refill(now)
        if self.tokens >= 1.0 - _EPS:
            return now
        return now + (1.0 - self.tokens) / self.rate

    def throttled(self, now: float, sent_at: float) -> bool:
        """A 429 without Retry-After for a call sent at ``sent_at``: multiplicative decrease
        and an empty bucket, once per round (a call sent before the last decrease belongs to
        that round). True when the rate was lowered."""
        if sent_at < self.last_decrease:
            return False
        self.refill(now)
        self.tokens = 0.0
        self.rate = max(self.limits.floor, self.rate * self.limits.decrease)
        self.last_decrease = now
        self.changed = now
        return True

    def pause(self, now: float, seconds: float) -> None:
        """Retry-After: no call before ``now + seconds``; then one token, and the rate's."""
        self.refill(now)
        self.tokens = 1.0  # (none accrue while paused: one call, the probe, goes at the end)
        self.paused_until = max(self.paused_until, now + max(0.0, seconds))

    def succeeded(self, now: float) -> None:
        """Additive increase: ``probe`` req/s for each second since the rate last changed."""
        if self.rate >= self.limits.rate:
            self.changed = now
            return
        self.refill(now)
        dt = now - self.changed
        if dt > 0.0:
            self.rate = min(float(self.limits.rate), self.rate + self.limits.probe * dt)
            self.changed = now


class Provider:
    """One provider's capacity and its waiting actions."""

    def __init__(self, limits: ProviderLimits) -> None:
        self.limits = limits
        self.bucket = Bucket(limits)
        self.inflight: dict[str, float] = {}  # action id -> when it was sent
        self.spent = 0  # calls answered (budget), 429s refunded
        self.hour_start: float | None = None  # the hourly window's start (`budget_per_hour`)
        self.hour_spent = 0  # calls answered in it
        self.step: int | None = None  # the latest RL step a call named (`budget_per_step`)
        self.step_used: dict[int, int] = {}  # step -> calls charged (answered or in flight)
        self.slice_idx = -1  # static-split: its place among the slices (-1: a provider itself)
        self.heap: list[tuple[int, int, str]] = []  # (rank, seq, id); stale entries skipped
        self.entry: dict[str, tuple[int, int]] = {}  # id -> its live (rank, seq)
        # Tenants' fair share (`CoreConfig.tenant_shares`; docs/core.md, "Tenants' fair
        # share"): tenant -> its weight (None: one order for every call, the heap above).
        # With it each tenant's calls wait in a heap of their own, and the next call sent is
        # the head of the tenant with the fewest calls in flight over its weight.
        self.weight: Callable[[str], float] | None = None
        self.tenant_of: dict[str, str] = {}  # live (waiting or in flight) id -> its tenant
        self.theaps: dict[str, list[tuple[int, int, str]]] = {}  # tenant -> its (rank, seq, id)
        self.busy: dict[str, int] = {}  # tenant -> its calls in flight
        self._pick = ""  # the tenant `head` chose
        # counters (what /v1/stats shows)
        self.sent = 0
        self.throttles = 0
        self.decreases = 0
        self.pauses = 0
        self.coalesced = 0
        self.cache_hits = 0  # answered from the front door's cache (`payload["cached"]`)
        self.failed_budget = 0
        self.failed_step_budget = 0
        self.timed_out = 0

    @property
    def budget_left(self) -> int | None:
        b, bh = self.limits.budget, self.limits.budget_per_hour
        left = None if b is None else b - self.spent
        if bh is not None:
            hour = bh - self.hour_spent
            left = hour if left is None else min(left, hour)
        return left

    def roll(self, now: float) -> None:
        """The hourly window that holds ``now`` (a new one: nothing spent in it yet)."""
        if self.limits.budget_per_hour is None:
            return
        if self.hour_start is None:
            self.hour_start = now
        elif now >= self.hour_start + 3600.0:
            self.hour_start += 3600.0 * math.floor((now - self.hour_start) / 3600.0)
            self.hour_spent = 0

    _KEEP_STEPS = 64  # per-step counts kept (the latest steps; older ones are forgotten)

    def charge_step(self, step: int | None) -> tuple[int, str]:
        """Charge one call to its RL step (``step``, else the latest the provider saw, else 0)
        under ``budget_per_step``: (the step charged, '') or (the step, why not: the budget of
        that step is spent)."""
        if step is not None and (self.step is None or step > self.step):
            self.step = step
            if len(self.step_used) > self._KEEP_STEPS:
                for old in sorted(self.step_used)[:len(self.step_used) - self._KEEP_STEPS]:
                    del self.step_used[old]
        s = step if step is not None else (self.step if self.step is not None else 0)
        used = self.step_used.get(s, 0)
        cap = self.limits.budget_per_step
        if cap is not None and used >= cap:
            self.failed_step_budget += 1
            return s, (f"provider {self.limits.name!r}: budget of {cap} calls for step {s} spent "
                       f"({used} answered or in flight)")
        self.step_used[s] = used + 1
        return s, ""

    def refund_step(self, step: int) -> None:
        """A charged call the provider never answered (it failed, timed out or was cancelled
        before an answer; a 429 is not an answer but the call waits again, still charged)."""
        used = self.step_used.get(step, 0)
        if used > 0:
            self.step_used[step] = used - 1

    def push(self, aid: str, rank: int, seq: int) -> None:
        self.entry[aid] = (rank, seq)
        if self.weight is None:
            heapq.heappush(self.heap, (rank, seq, aid))
        else:
            t = self.tenant_of.get(aid, "")
            h = self.theaps.get(t)
            if h is None:
                h = self.theaps[t] = []
            heapq.heappush(h, (rank, seq, aid))

    def head(self) -> str | None:
        if self.weight is not None:
            return self._fair_head(self.weight)
        heap = self.heap
        while heap:
            rank, seq, aid = heap[0]
            if self.entry.get(aid) == (rank, seq):
                return aid
            heapq.heappop(heap)
        return None

    def _fair_head(self, weight: Callable[[str], float]) -> str | None:
        """The next call with tenants: of the tenant with the fewest calls in flight over its
        weight, its best (aged first, then rank, then arrival); ties to the better head."""
        best: tuple[float, int, int] | None = None
        for t, h in list(self.theaps.items()):
            while h:
                rank, seq, aid = h[0]
                if self.entry.get(aid) == (rank, seq):
                    break
                heapq.heappop(h)
            if not h:
                del self.theaps[t]
                continue
            mine = (self.busy.get(t, 0) / weight(t), h[0][0], h[0][1])
            if best is None or mine < best:
                best, self._pick = mine, t
        return None if best is None else self.theaps[self._pick][0][2]

    def pop(self) -> str:
        if self.weight is not None:
            got = self.head()
            assert got is not None
            heapq.heappop(self.theaps[self._pick])
            del self.entry[got]
            return got
        _rank, _seq, aid = heapq.heappop(self.heap)
        del self.entry[aid]
        return aid

    def sent_one(self, aid: str) -> None:
        """``aid`` is in flight: its tenant holds one more slot (fair share only)."""
        if self.weight is not None:
            t = self.tenant_of.get(aid, "")
            self.busy[t] = self.busy.get(t, 0) + 1

    def landed(self, aid: str, done: bool) -> None:
        """``aid``'s call came back (``done``: for good, else it waits again): its tenant holds
        one slot less (fair share only)."""
        if self.weight is not None:
            t = self.tenant_of.get(aid, "")
            n = self.busy.get(t, 0) - 1
            if n > 0:
                self.busy[t] = n
            else:
                self.busy.pop(t, None)
        if done:
            self.tenant_of.pop(aid, None)

    def drop(self, aid: str) -> None:
        self.entry.pop(aid, None)  # (its heap entry is skipped when it comes up)

    def stats(self) -> dict[str, Any]:
        return {
            "rate": round(self.bucket.rate, 6), "rate_limit": self.limits.rate,
            "burst": self.limits.burst, "concurrency": self.limits.concurrency,
            "in_flight": len(self.inflight), "waiting": len(self.entry), "sent": self.sent,
            "throttled": self.throttles, "rate_decreases": self.decreases, "pauses": self.pauses,
            "coalesced": self.coalesced, "served_from_cache": self.cache_hits,
            "budget": self.limits.budget,
            "budget_left": self.budget_left, "failed_budget": self.failed_budget,
            "budget_per_hour": self.limits.budget_per_hour, "hour_spent": self.hour_spent,
            "budget_per_step": self.limits.budget_per_step, "step": self.step,
            "step_used": self.step_used.get(self.step if self.step is not None else 0, 0),
            "failed_step_budget": self.failed_step_budget,
            "timed_out_waiting": self.timed_out,
        }


def rank_of(expected_s: float, weight: float) -> int:
    """Expected work / weight in half-octave classes (as `queues.Queues.rank`), > `_AGED`."""
    x = expected_s / weight
    if x <= 0.0:
        return 1
    m, e = math.frexp(x)
    return 2 * e + (m >= _SQRT_HALF) + 2000  # (+2000: every class above 1 and `_AGED`)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A call to send: the action and its provider."""

    action_id: str
    provider: str


class Providers:
    """Every provider's bucket, slots, budget and waiting actions; coalesced calls.

    The core hands it actions (`arrive`), reports (`finished`, `throttled`), and asks it what
    to send now (`ready`), what to fail (`exhausted`, `overdue`) and when to be woken
    (`next_wake`). It never touches a record's status: the core moves them.
    """

    def __init__(self, limits: tuple[ProviderLimits, ...], aging_s: float = 30.0, *,
                 policy: str = "tangram", semaphore: int | None = None, coalesce: bool = True,
                 trajectories: int = 1) -> None:
        if policy not in PROVIDER_POLICIES:
            raise ValueError(f"provider_policy: must be one of {', '.join(PROVIDER_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.paced = policy != "semaphore"  # token buckets apply (not under a bare semaphore)
        self.semaphore = semaphore
        self.coalesce = coalesce
        self.trajectories = max(1, trajectories)
        self.tslot: dict[str, int] = {}  # static-split: trajectory -> its slice
        self.by_name: dict[str, Provider] = {}
        for lim in limits:
            if lim.name in self.by_name:
                raise ValueError(f"providers[{lim.name!r}]: declared twice")
            self.by_name[lim.name] = Provider(lim)
        self.base = list(self.by_name.values())  # the declared providers, looked at every event
        # static-split's slices (one per trajectory: thousands) are looked at only when one may
        # send: `dirty` (a call arrived or a slot freed since the last `ready`) or its next
        # token due (`wakes`, a heap of (time, slice); `wake_at`, each slice's live entry).
        # Slices have no budgets and a fixed rate, so nothing else changes what they may send.
        self.slices: list[Provider] = []
        self.dirty: set[int] = set()
        self.wakes: list[tuple[float, int]] = []
        self.wake_at: dict[int, float] = {}
        self._early = 0.0  # how early `ready` looks at a slice: its bucket's tolerance, and more
        self.aging_s = aging_s
        self.owner: dict[str, str] = {}  # live action id (waiting or in flight) -> provider
        self.deadline: dict[str, float] = {}  # waiting action -> when it times out waiting
        self.timers: list[tuple[float, int, str, str]] = []  # (time, seq, kind, id): "age"/"due"
        self.leaders: dict[tuple[str, str], str] = {}  # (provider, coalesce key) -> leader id
        self.key_of: dict[str, tuple[str, str]] = {}  # leader id -> its (provider, key)
        self.followers: dict[str, list[str]] = {}  # leader id -> followers, in arrival order
        self.follows: dict[str, str] = {}  # follower id -> leader id
        self.wake_sent = math.inf  # the earliest WakeAt asked for and not yet passed
        # action -> (provider, RL step) it is charged to (`budget_per_step`), until it ends
        self.charged: dict[str, tuple[str, int]] = {}
        self.refunded: tuple[str, int] | None = None  # the last `forget`'s refund (`promote`)
        # tenants' fair share: tenant -> its weight (`CoreState.tenant_weight`); None: off
        self.tenant_weight: Callable[[str], float] | None = None
        self._tseq = 0

    @property
    def active(self) -> bool:
        return bool(self.by_name)

    @property
    def retry_429(self) -> bool:
        """A 429 sends the call back to wait (else it fails at once: the semaphore baseline)."""
        return self.policy != "semaphore"

    def _slice(self, prov: Provider, trajectory: str | None, now: float) -> Provider:
        """static-split: the trajectory's own slice of ``prov`` (made on first use). Slice j's
        first token comes j / rate after the first call: the slices' tokens interleave evenly
        (the strongest static split: together they never burst past the provider's rate)."""
        t = trajectory or ""
        j = self.tslot.get(t)
        if j is None:
            j = self.tslot[t] = len(self.tslot) % self.trajectories
        name = f"{prov.limits.name}#{j}"
        got = self.by_name.get(name)
        if got is None:
            lim = prov.limits
            T = self.trajectories
            got = self.by_name[name] = Provider(ProviderLimits(
                name=name, rate=lim.rate / T, burst=1.0, concurrency=max(1, lim.concurrency // T),
                decrease=lim.decrease, max_attempts=lim.max_attempts))
            if j:
                got.bucket.pause(now, j / lim.rate)
            got.slice_idx = len(self.slices)
            self.slices.append(got)
            self._early = max(self._early, 1e-6 + 2 * _EPS / got.bucket.rate)
        return got

    def _touch(self, prov: Provider) -> None:
        """``prov`` may send now where it could not (a call waits, or a slot came free)."""
        if prov.slice_idx >= 0:
            self.dirty.add(prov.slice_idx)

    def holds(self, aid: str) -> bool:
        """``aid`` is a provider action this part knows (waiting, in flight, leading or
        following a coalesced call)."""
        return aid in self.owner or aid in self.follows or aid in self.key_of

    # ---- arrivals -----------------------------------------------------------------------------
    def arrive(self, aid: str, provider: str, key: str | None, rank: int, seq: int,
               now: float, deadline: float, trajectory: str | None = None,
               step: int | None = None, tenant: str | None = None) -> str:
        """Queue a new action, or attach it to an identical call in flight or waiting (same
        provider and coalescing key: it costs no budget). Returns '' when it waits, else why it
        cannot (the core fails it at once): a spent budget in total, this hour, or of the
        action's RL ``step``."""
        prov = self.by_name.get(provider)
        if not self.coalesce:
            key = None
        if self.policy == "semaphore":
            rank = 1  # (FIFO)
        if prov is None:
            names = ", ".join(sorted(self.by_name)) or "none declared"
            return f"unknown provider {provider!r} (providers: {names})"
        if key:
            leader = self.leaders.get((provider, key))
            if leader is not None:
                self.followers.setdefault(leader, []).append(aid)
                self.follows[aid] = leader
                prov.coalesced += 1
                return ""
        prov.roll(now)
        left = prov.budget_left
        if left is not None and left <= 0:
            prov.failed_budget += 1
            return self.budget_reason(prov, now)
        if prov.limits.budget_per_step is not None or step is not None:
            # (without a budget a call naming its step is counted the same way, and refunded
            # the same way: `step_used` is always the step's calls answered or in flight)
            charged, why = prov.charge_step(step)
            if why:
                return why
            self.charged[aid] = (provider, charged)
        if key:
            self.leaders[(provider, key)] = aid
            self.key_of[aid] = (provider, key)
        if self.policy == "static-split":
            prov = self._slice(prov, trajectory, now)
        self.owner[aid] = prov.limits.name
        self.enqueue(prov, aid, rank, seq, now, deadline, tenant)
        return ""

    def enqueue(self, prov: Provider, aid: str, rank: int, seq: int, now: float,
                deadline: float, tenant: str | None = None) -> None:
        if self.tenant_weight is not None:  # (fair share: each tenant's calls apart)
            prov.weight = self.tenant_weight
            if tenant is not None:
                prov.tenant_of[aid] = tenant
        prov.push(aid, rank, seq)
        self._touch(prov)
        self.deadline[aid] = deadline
        self._timer(now + self.aging_s, "age", aid)
        if math.isfinite(deadline):
            self._timer(deadline, "due", aid)

    def _timer(self, t: float, kind: str, aid: str) -> None:
        self._tseq += 1
        heapq.heappush(self.timers, (t, self._tseq, kind, aid))

    @staticmethod
    def budget_reason(prov: Provider, now: float) -> str:
        lim = prov.limits
        if (lim.budget is None or prov.spent < lim.budget) and lim.budget_per_hour is not None:
            ends = (prov.hour_start if prov.hour_start is not None else now) + 3600.0
            return (f"provider {lim.name!r}: budget of {lim.budget_per_hour} calls per hour spent "
                    f"(the next hour starts in {max(0.0, ends - now):.0f} s)")
        return (f"provider {prov.limits.name!r}: budget of {prov.limits.budget} calls spent "
                f"({prov.spent} answered)")

    # ---- what to send now ---------------------------------------------------------------------
    def ready(self, now: float) -> list[Dispatch]:
        """The calls to send now, provider by provider (the declared ones, then static-split's
        slices, each in the order it was made): while a head waits, a token and a slot are there
        and budget is left. Takes the token and the slot."""
        out: list[Dispatch] = []
        for prov in self.base:
            if prov.entry:
                self._send(prov, now, out)
        if self.dirty or (self.wakes and self.wakes[0][0] <= now + self._early):
            for j in self._due_slices(now):
                prov = self.slices[j]
                if prov.entry:
                    self._send(prov, now, out)
                if prov.entry and len(prov.inflight) < prov.limits.concurrency:
                    t = prov.bucket.next_token_at(now)  # (waits for a token: woken then)
                    self.wake_at[j] = t
                    heapq.heappush(self.wakes, (t, j))
                else:  # (nothing waits, or no slot: an arrival or a report touches it)
                    self.wake_at.pop(j, None)
        return out

    def _due_slices(self, now: float) -> list[int]:
        """The slices that may send now: touched, or their next token due (within the bucket's
        tolerance, `Bucket.ready`), in the order they were made."""
        js = self.dirty
        self.dirty = set()
        lim = now + self._early
        wakes = self.wakes
        while wakes and wakes[0][0] <= lim:
            t, j = heapq.heappop(wakes)
            if self.wake_at.get(j) == t:
                del self.wake_at[j]
                js.add(j)
        return sorted(js)

    def _send(self, prov: Provider, now: float, out: list[Dispatch]) -> None:
        lim = prov.limits
        prov.roll(now)
        cap = lim.concurrency if self.paced else (self.semaphore or lim.concurrency)
        base = lim.name.partition("#")[0]
        while prov.entry and len(prov.inflight) < cap:
            left = prov.budget_left
            if left is not None and left - len(prov.inflight) <= 0:
                break  # (calls in flight may still answer: the rest fail if they do)
            if self.paced and not prov.bucket.ready(now):
                break
            if prov.head() is None:
                break
            aid = prov.pop()
            self.deadline.pop(aid, None)
            if self.paced:
                prov.bucket.take()
            prov.inflight[aid] = now
            prov.sent_one(aid)
            prov.sent += 1
            out.append(Dispatch(aid, base))

    def exhausted(self, now: float) -> list[tuple[str, str]]:
        """Waiting actions of providers whose budget is spent: (id, reason), to fail now."""
        out: list[tuple[str, str]] = []
        for prov in self.base:  # (slices have no budget)
            prov.roll(now)
            left = prov.budget_left
            if left is None or left > 0 or not prov.entry:
                continue
            reason = self.budget_reason(prov, now)
            while prov.head() is not None:
                aid = prov.pop()
                prov.failed_budget += 1
                out.append((aid, reason))
        return out

    def due(self, now: float) -> list[tuple[str, str]]:
        """Age waiting actions whose time came (they go first) and return those whose deadline
        passed while waiting: (id, reason), to time out now."""
        out: list[tuple[str, str]] = []
        timers = self.timers
        while timers and timers[0][0] <= now + _EPS:
            _t, _s, kind, aid = heapq.heappop(timers)
            name = self.owner.get(aid)
            if name is None:
                continue
            prov = self.by_name[name]
            got = prov.entry.get(aid)
            if got is None:
                continue  # (in flight, or gone)
            if kind == "age":
                if got[0] != _AGED:
                    prov.push(aid, _AGED, got[1])
            else:
                prov.drop(aid)
                prov.timed_out += 1
                b = prov.bucket
                out.append((aid, f"provider {name!r}: no token and slot within the deadline "
                                  f"({len(prov.inflight)} of {prov.limits.concurrency} slots "
                                  f"busy, rate {b.rate:.4g}/s)"))
        return out

    def next_wake(self, now: float) -> float:
        """When the core must look again: the earliest next token of a provider whose head
        waits for one (not for a slot: a report frees that). Deadlines and aging are looked at
        on every event, so at the driver's Tick (0.5 s) at the latest: no wake of their own."""
        best = math.inf
        if not self.paced:
            return best
        for prov in self.base:
            if not prov.entry or len(prov.inflight) >= prov.limits.concurrency:
                continue
            left = prov.budget_left
            if left is not None and left - len(prov.inflight) <= 0:
                continue
            t = prov.bucket.next_token_at(now)
            if t < best:
                best = t
        wakes = self.wakes
        while wakes:  # (static-split: the earliest slice that still waits for a token)
            t, j = wakes[0]
            sl = self.slices[j]
            if self.wake_at.get(j) == t and sl.entry and len(sl.inflight) < sl.limits.concurrency:
                return min(best, t)
            heapq.heappop(wakes)
            if self.wake_at.get(j) == t:
                del self.wake_at[j]
        return best

    # ---- reports ------------------------------------------------------------------------------
    def release(self, aid: str) -> Provider | None:
        """The call ``aid`` came back (any outcome): its slot is free."""
        name = self.owner.pop(aid, None)
        if name is None:
            return None
        prov = self.by_name[name]
        if prov.inflight.pop(aid, None) is not None:
            prov.landed(aid, True)
            self._touch(prov)
        else:
            prov.tenant_of.pop(aid, None)
        return prov

    def uncharge(self, aid: str, answered: bool) -> tuple[str, int] | None:
        """``aid`` leaves its RL step's count: kept when the provider answered it (billed),
        refunded else (returns what was refunded)."""
        got = self.charged.pop(aid, None)
        if got is None or answered:
            return None
        self.by_name[got[0]].refund_step(got[1])
        return got

    def finished(self, aid: str, now: float, answered: bool) -> None:
        self.uncharge(aid, answered)
        prov = self.release(aid)
        if prov is not None and answered:
            prov.roll(now)
            prov.spent += 1
            prov.hour_spent += 1
            prov.bucket.succeeded(now)

    def throttled(self, aid: str, now: float, retry_after_s: float | None) -> Provider | None:
        """A 429 for ``aid``: the slot is free, the bucket lowered or paused. The caller
        requeues the action (`requeue`) or fails it past ``max_attempts``."""
        name = self.owner.get(aid)
        if name is None:
            return None
        prov = self.by_name[name]
        if aid in prov.inflight:
            prov.landed(aid, False)
        sent_at = prov.inflight.pop(aid, now)
        self._touch(prov)
        prov.throttles += 1
        if retry_after_s is not None:
            prov.bucket.pause(now, retry_after_s)
            prov.pauses += 1
        elif self.policy == "tangram" and prov.bucket.throttled(now, sent_at):
            prov.decreases += 1
        return prov

    def requeue(self, aid: str, rank: int, seq: int, now: float, deadline: float) -> None:
        """A throttled call waits again, in its old place (same rank and arrival order)."""
        prov = self.by_name[self.owner[aid]]
        self.enqueue(prov, aid, rank, seq, now, deadline)

    # ---- ends ---------------------------------------------------------------------------------
    def forget(self, aid: str) -> None:
        """``aid`` ended (any terminal status) while waiting or as a follower: forget it. An
        in-flight call keeps its slot until its report (`release`)."""
        leader = self.follows.pop(aid, None)
        if leader is not None:
            fl = self.followers.get(leader)
            if fl is not None and aid in fl:
                fl.remove(aid)
            return
        self.refunded = self.uncharge(aid, False)  # (an answered call: settled by `finished`)
        name = self.owner.get(aid)
        if name is not None:
            prov = self.by_name[name]
            if aid in prov.entry:
                prov.drop(aid)
            if aid not in prov.inflight:  # (in flight: its slot is held until its report)
                del self.owner[aid]
                prov.tenant_of.pop(aid, None)
            self.deadline.pop(aid, None)
        key = self.key_of.pop(aid, None)
        if key is not None and self.leaders.get(key) == aid:
            del self.leaders[key]

    def take_followers(self, aid: str) -> list[str]:
        """The followers of a leader that ended (they get its outcome, or one becomes the new
        leader: `promote`)."""
        got = self.followers.pop(aid, [])
        for f in got:
            self.follows.pop(f, None)
        return got

    def promote(self, aid: str, provider: str, key: str, followers: list[str]) -> None:
        """``aid`` (a follower of a cancelled leader) leads the rest."""
        self.leaders[(provider, key)] = aid
        self.key_of[aid] = (provider, key)
        self.owner[aid] = provider
        got = self.refunded  # (the cancelled leader's charge, just refunded by `forget`)
        if got is not None:
            self.refunded = None
            prov = self.by_name[got[0]]
            prov.step_used[got[1]] = prov.step_used.get(got[1], 0) + 1
            self.charged[aid] = got
        if followers:
            self.followers[aid] = followers
            for f in followers:
                self.follows[f] = aid

    # ---- views --------------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: prov.stats() for name, prov in sorted(self.by_name.items())}

    def check(self, live: dict[str, Any]) -> list[str]:
        """Broken invariants, in words (empty: none)."""
        bad: list[str] = []
        for name, prov in self.by_name.items():
            lim = prov.limits
            if not -_EPS <= prov.bucket.tokens <= lim.burst + _EPS:
                bad.append(f"{name}: tokens {prov.bucket.tokens} outside [0, {lim.burst}]")
            if len(prov.inflight) > lim.concurrency:
                bad.append(f"{name}: {len(prov.inflight)} in flight > {lim.concurrency}")
            if lim.budget is not None and prov.spent > lim.budget:
                bad.append(f"{name}: spent {prov.spent} > budget {lim.budget}")
            if lim.budget_per_hour is not None and prov.hour_spent > lim.budget_per_hour:
                bad.append(f"{name}: {prov.hour_spent} this hour > {lim.budget_per_hour}")
            if prov.weight is not None:  # (fair share: each tenant's slots counted right)
                held: dict[str, int] = {}
                for aid in prov.inflight:
                    t = prov.tenant_of.get(aid, "")
                    held[t] = held.get(t, 0) + 1
                if held != prov.busy:
                    bad.append(f"{name}: tenants' calls in flight {held} but counted {prov.busy}")
            cap = lim.budget_per_step
            for s, used in prov.step_used.items():
                if cap is not None and used > cap:
                    bad.append(f"{name}: {used} charged to step {s} > {cap}")
            for aid in prov.entry:  # (each provider's waiting calls: its own, charged or not)
                if self.owner.get(aid) != name:
                    bad.append(f"{name}: waiting {aid} not owned")
        for aid, (name, s) in self.charged.items():
            if not self.holds(aid):
                bad.append(f"{aid} charged to {name} step {s} but not live")
        for f, leader in self.follows.items():
            if leader not in live:
                bad.append(f"follower {f} of {leader}, which is not live")
        return bad
