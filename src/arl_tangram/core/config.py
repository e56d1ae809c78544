"""Configuration of the scheduler core: one frozen, keyword-only dataclass, validated.

Invariant: a `CoreConfig` that exists is valid. Every bad value raises `ValueError` naming the
field and the value. All durations are seconds on the driver's clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .providers import ProviderLimits
from .resources import Resources

POLICIES = ("tangram", "trajectory-bound", "task-isolated", "fifo", "static-pool")
ENGINE_ROUTINGS = ("cost", "sticky", "least-loaded", "round-robin")


def _bad(name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"CoreConfig.{name}: {rule}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    """Knobs of the scheduler core (policy and its costs)."""

    # Which scheduling policy runs: one of POLICIES.
    policy: str = "tangram"
    # Concurrent trajectories; trajectory-bound splits the CPU capacity evenly over them
    # (fractional CPU quotas allowed). None: one slice per node.
    trajectories: int | None = None
    # Measured demand share per task; task-isolated sizes each task's pool in proportion.
    # None: one pool shared by all tasks.
    task_shares: Mapping[str, float] | None = None
    # static-pool: the fixed allotment of every elastic action along its elastic dimension
    # (clamped to the action's range and to the largest node). None: the action's maximum.
    static_k: float | None = None
    # Queueing time after which an action is served before any non-aged one (no starvation);
    # a blocked aged action reserves the node closest to fitting it.
    aging_s: float = 30.0
    # An action also ages once it has waited this many times its expected duration (but never
    # sooner than `aging_min_s`): under sustained overload a 5 ms action is not held for
    # `aging_s` behind ever-newer ones whose estimates happen to be a little lower.
    aging_relative: float = 50.0
    aging_min_s: float = 0.5
    # Fraction of every node's capacity kept back from elastic expansion for expected arrivals.
    reserve_fraction: float = 0.0
    # Quantile of the duration estimate used to order actions (0.5 = median).
    estimate_quantile: float = 0.5
    # Expected cost of a cold sandbox start (no warm executor on the node), charged in placement.
    sandbox_cold_s: float = 0.5
    # Idle time after which tangram/fifo park a model instance (UnloadModel park=True) even
    # though nothing else needs its devices. inf (default): park only lazily, when another model
    # or a GPU action needs the devices (an idle instance on otherwise idle devices costs no one
    # anything, and a reload costs ACT).
    model_idle_s: float = math.inf
    # tangram/fifo fill free devices at the first event (and on an added node) round-robin over
    # the models up to ``max_instances``, as static provisioning does; unlike static, those
    # instances are parked when another model or a GPU action needs the devices.
    model_prewarm: bool = True
    # Scale a model out onto free devices while its queue exceeds what is already coming (a
    # knee batch per loading instance) plus this many knee batches per ready instance -- even
    # when the queue would drain before a cold load completes (0: any wait scales out).
    scale_out_batches: float = 0.0
    # Instances of each model tangram/fifo load at the first event and never scale in below
    # (the static baselines load their whole set up front; this is the elastic minimum).
    model_min_instances: int = 1
    # Longest an action may wait for its batch to fill toward the knee (0: dispatch at once).
    max_batch_wait_s: float = 0.0
    # Spread the batch starts of a model's instances (`ModelPlanner.staggered`): an idle instance
    # holds a batch below the knee until ``alpha / ready instances`` after the model's last
    # start, where arrivals come faster than that (False: dispatch at once).
    stagger_batches: bool = True
    # Consecutive failed loads of one model after which its queued actions fail.
    max_load_failures: int = 3
    # Times an action of a batch whose instance died mid-batch (an unsolicited ModelUnloaded)
    # is queued again before it fails with the reason: a batch that died produced no score, so
    # running it again scores nothing twice; the bound stops a batch that kills every worker.
    model_worker_retries: int = 1
    # How queued actions of a judge engine (``ModelSpec.max_seqs > 0``) choose their instance
    # (docs/core.md, "Routing to judge engines"): "cost" (least expected delay, the prefix cache
    # weighed: sticky per trajectory while that pays), "sticky" (the instance that served the
    # trajectory while it has a free sequence, else the least loaded: verl's and ROLL's
    # routers), "least-loaded" (fewest sequences in flight), "round-robin".
    engine_routing: str = "cost"
    # Demand held by a session opened implicitly by an action naming an unknown session.
    session_demand: Resources = Resources(memory_mb=256)  # noqa: RUF009 - immutable
    # Room kept on a session's node, beyond what its sessions hold, for one of their actions
    # (grown to the largest session action seen): sessions never fill a node so that their own
    # actions cannot run there.
    session_action_demand: Resources = Resources(cpu=1, memory_mb=1024)  # noqa: RUF009 - immutable
    # Time-to-live of an implicitly opened session (closed after this long without an action).
    session_ttl_s: float = 600.0
    # Memory that follows use (issue 26, docs/core.md "Session memory"): once its node has
    # reported a session's measured memory (`MemoryReport`), the session is charged
    # max(its recent peak x `session_memory_headroom`, `session_memory_floor_mb`), at most its
    # demand, instead of its demand's memory_mb (before the first report: its demand). Its
    # cgroup's memory.max stays its demand, so it can still burst to it.
    session_memory_headroom: float = 1.5
    session_memory_floor_mb: float = 64.0
    # A node admits a new session only while the memory its open sessions demand (their caps),
    # with the new one, is at most this many times its memory (>= 1; 1: no overcommit).
    session_memory_overcommit: float = 3.0
    # A node whose measured memory (its sessions' and other sandboxes' use now) exceeds this
    # fraction of its memory is short: its idle sessions (no action starting or running) are
    # evicted, largest use first, until the rest is under it; one with an action running is
    # never evicted. 1.0: only past the whole memory.
    memory_high_watermark: float = 0.9
    # Window over which arrival rates are measured for warm-pool targets.
    rate_window_s: float = 60.0
    # Time over which the peak arrival rate of a warm key is forgotten: an RL step's burst of
    # tool calls recurs every step (minutes apart), so the pool for it is kept across steps.
    peak_memory_s: float = 600.0
    # Most warm executors per node and key that tangram asks for. None: eight per core of the
    # node, at least 16. An idle sandbox costs ~2 MB (docs/sandbox.md: 2.2 MB PSS), so 64 on an
    # 8-core node is ~0.13 GiB, while a burst of short actions takes a sandbox per action and a
    # pool refills only in a cold-start time: with 8 per node, tool-math on one 8-core node
    # cold-started 2-4 of ~890 actions; with 16 (two per core), humaneval-tests on 2 x 8 cores
    # cold-started 75-99 of 384 tests (7x a static pool's ACT, whose sandboxes stay resident);
    # with 64 none (measured 2026-11-26).
    max_warm_per_node: int | None = None
    # Warm-pool keys (languages, tools) the operator names: their pools are filled from the
    # first event and keep `min_warm_per_node` whatever the arrival rate (tangram, fifo).
    warm_keys: tuple[str, ...] = ()
    # Sandboxes per named warm key kept warm over the cluster from the first event (capped by
    # `max_warm_per_node` per node), whatever the arrival rate: what a static stack keeps
    # resident, one per trajectory that uses the key. Above it the measured arrival rate sizes
    # the pools. None: `min_warm_per_node` per node only.
    warm_boot: Mapping[str, int] | None = None
    # Fewest warm executors per node that tangram keeps for a key in use (at least one arrival
    # per `rate_window_s`): an idle sandbox costs a few MB, a miss costs a cold start.
    min_warm_per_node: int = 2
    # Elastic expansion step along the elastic dimension (units per grant).
    elastic_step: float = 1.0
    # tangram/fifo: a rigid one-shot action expected to run at most this long is admitted by
    # the CPU it was measured to use (`ActionFinished.cpu_s` over its run time, the mean over
    # the last 32 of its kind, x1.25, rounded up to 1/8, 1/4 or 1/2 of its demand): its node
    # is charged that, its cgroup quota stays its demand. 0 (default): charge the demand.
    # Measured (docs/api.md): at 64 clients of trivial /run_code, 1.0 cut the machine's idle
    # time from 14-16% to 11-12% and p50 by ~5%, but the p99 rose 2-4x (aged actions wait
    # longer for a whole reserved share), so it is opt-in.
    short_action_s: float = 0.0
    # Finished actions remembered for status()/story() (oldest forgotten first).
    history: int = 100_000
    # Candidate nodes compared per placement (best fit among the first that fit).
    fit_candidates: int = 4
    # Providers (web search, page fetch, any HTTP API) whose limits the core schedules as
    # capacity: search/fetch/http actions name one in their tag (core/providers.py).
    providers: tuple[ProviderLimits, ...] = ()
    # How provider calls are scheduled: "tangram" (token buckets, AIMD, SRPT), or a baseline:
    # "semaphore" (a per-process semaphore of `provider_semaphore` slots, default each
    # provider's concurrency; no pacing; a 429 fails the call) or "static-split" (each
    # trajectory owns 1/`trajectories` of each provider's rate and slots); core/providers.py.
    provider_policy: str = "tangram"
    provider_semaphore: int | None = None
    # Identical calls in flight (`payload["coalesce"]`) share one call (False: each its own).
    provider_coalesce: bool = True
    # Tenants' weights of the cluster (`ActionSpec.tenant` -> a finite number > 0; docs/core.md,
    # "Tenants' fair share"): under contention each free slot goes to the tenant with the
    # least dominant share of what is in use, over its weight (DRF), its own actions in the
    # policy's order; capacity a tenant leaves idle is lent to the others. A tenant not named
    # here (and actions naming none, as one tenant) weighs the smallest weight named.
    # None (default): no tenants, every action in one order, as before.
    tenant_shares: Mapping[str, float] | None = None
    # With tenants' shares: the least fraction of its CPU a running action of a tenant above
    # its share keeps when a tenant below its share takes its share back at once (its cgroup
    # quota lowered for a while: time-slicing, `lending.py`). 1.0: nothing is taken back; a
    # tenant then waits for a lent core to free (the rest of one running action).
    lend_floor: float = 0.5
    # With lent CPU taken back: how long the CPU an action started on taken-back CPU frees at
    # its end stays held for its tenant while the node has squeezed actions (anticipation: a
    # client sending one action after the other's answer starts the next on it, with no
    # squeeze and regrowth in between; `lending.py`). 0: grown back at once.
    lend_anticipation_s: float = 0.02

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise _bad("policy", self.policy, f"must be one of {', '.join(POLICIES)}")
        if self.trajectories is not None and (
            not isinstance(self.trajectories, int) or self.trajectories < 1
        ):
            raise _bad("trajectories", self.trajectories, "must be a positive integer or None")
        if self.task_shares is not None:
            if not self.task_shares:
                raise _bad("task_shares", self.task_shares, "must name at least one task")
            for task, share in self.task_shares.items():
                if not (isinstance(share, int | float) and share > 0 and math.isfinite(share)):
                    raise _bad(f"task_shares[{task!r}]", share, "must be a finite number > 0")
        if self.tenant_shares is not None:
            if not self.tenant_shares:
                raise _bad("tenant_shares", self.tenant_shares, "must name at least one tenant")
            for tenant, share in self.tenant_shares.items():
                if not isinstance(tenant, str):
                    raise _bad("tenant_shares", tenant, "keys must be tenant names (str)")
                if not (isinstance(share, int | float) and not isinstance(share, bool)
                        and share > 0 and math.isfinite(share)):
                    raise _bad(f"tenant_shares[{tenant!r}]", share, "must be a finite number > 0")
        if self.static_k is not None:
            self._check_range("static_k", self.static_k, 0.0, math.inf, low_open=True)
        self._check_range("aging_s", self.aging_s, 0.0, math.inf, low_open=True)
        self._check_range("aging_relative", self.aging_relative, 0.0, math.inf, low_open=True)
        self._check_range("aging_min_s", self.aging_min_s, 0.0, math.inf)
        if self.aging_min_s > self.aging_s:  # (the rule "at least aging_min_s, at most aging_s")
            raise _bad("aging_min_s", self.aging_min_s, f"must be <= aging_s ({self.aging_s!r})")
        self._check_range("reserve_fraction", self.reserve_fraction, 0.0, 1.0, high_open=True)
        self._check_range("estimate_quantile", self.estimate_quantile, 0.0, 1.0)
        for name in ("sandbox_cold_s", "model_idle_s", "max_batch_wait_s", "scale_out_batches",
                     "short_action_s"):
            self._check_range(name, getattr(self, name), 0.0, math.inf)
        self._check_range("session_memory_headroom", self.session_memory_headroom, 1.0, math.inf)
        self._check_range("session_memory_floor_mb", self.session_memory_floor_mb, 0.0, math.inf)
        self._check_range("session_memory_overcommit", self.session_memory_overcommit, 1.0,
                          math.inf)
        self._check_range("memory_high_watermark", self.memory_high_watermark, 0.0, 1.0,
                          low_open=True)
        self._check_range("lend_floor", self.lend_floor, 0.0, 1.0, low_open=True)
        self._check_range("lend_anticipation_s", self.lend_anticipation_s, 0.0, 60.0)
        for name in ("session_ttl_s", "rate_window_s", "peak_memory_s", "elastic_step"):
            self._check_range(name, getattr(self, name), 0.0, math.inf, low_open=True)
        for name in ("max_load_failures", "history", "fit_candidates"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise _bad(name, v, "must be an integer >= 1")
        if not isinstance(self.model_prewarm, bool):
            raise _bad("model_prewarm", self.model_prewarm, "must be a bool")
        if self.engine_routing not in ENGINE_ROUTINGS:
            raise _bad("engine_routing", self.engine_routing,
                       f"must be one of {', '.join(ENGINE_ROUTINGS)}")
        if not isinstance(self.model_worker_retries, int) or self.model_worker_retries < 0:
            raise _bad("model_worker_retries", self.model_worker_retries, "must be an integer >= 0")
        if not isinstance(self.model_min_instances, int) or self.model_min_instances < 0:
            raise _bad("model_min_instances", self.model_min_instances, "must be an integer >= 0")
        if self.warm_boot is not None:
            for key, n in self.warm_boot.items():
                if not (isinstance(key, str) and key and isinstance(n, int) and n >= 0):
                    raise _bad(f"warm_boot[{key!r}]", n, "must be a count >= 0 of a non-empty key")
        if not isinstance(self.warm_keys, tuple) or not all(isinstance(k, str) and k for k in self.warm_keys):
            raise _bad("warm_keys", self.warm_keys, "must be a tuple of non-empty strings")
        for name in ("max_warm_per_node", "min_warm_per_node"):
            v = getattr(self, name)
            if (v is not None or name == "min_warm_per_node") and (not isinstance(v, int) or v < 0):
                raise _bad(name, v, "must be an integer >= 0" + (" or None" if name[1] == "a" else ""))
        if not isinstance(self.providers, tuple) or not all(
                isinstance(p, ProviderLimits) for p in self.providers):
            raise _bad("providers", self.providers, "must be a tuple of ProviderLimits")
        from .providers import PROVIDER_POLICIES

        if self.provider_policy not in PROVIDER_POLICIES:
            raise _bad("provider_policy", self.provider_policy, f"must be one of {', '.join(PROVIDER_POLICIES)}")
        if self.provider_semaphore is not None and (
                not isinstance(self.provider_semaphore, int) or self.provider_semaphore < 1):
            raise _bad("provider_semaphore", self.provider_semaphore, "must be an integer >= 1 or None")
        if not isinstance(self.provider_coalesce, bool):
            raise _bad("provider_coalesce", self.provider_coalesce, "must be a bool")
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise _bad("providers", names, "must name each provider once")
        for name in ("session_demand", "session_action_demand"):
            if not isinstance(getattr(self, name), Resources):
                raise _bad(name, getattr(self, name), "must be a Resources")

    @staticmethod
    def _check_range(
        name: str,
        v: float,
        lo: float,
        hi: float,
        *,
        low_open: bool = False,
        high_open: bool = False,
    ) -> None:
        ok = isinstance(v, int | float) and not math.isnan(v)
        if ok:
            ok = (v > lo if low_open else v >= lo) and (v < hi if high_open else v <= hi)
        if not ok:
            lo_s = "(" if low_open else "["
            hi_s = ")" if high_open else "]"
            raise _bad(name, v, f"must be in {lo_s}{lo:g}, {hi:g}{hi_s}")
