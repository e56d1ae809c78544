"""What every part of the core reads: the records, the cluster, and the event in progress.

Invariant: `CoreState` holds only what more than one collaborator of `Core` needs (the records
tables, the nodes and their free index, the clock of the event, the commands it emits, the
nodes and queues the event changed); each collaborator owns the rest of its state itself
(`queues.Queues`, `placement.Placer`, `partitioning.Partitions`, `elastic.Elastic`,
`warmpools.WarmPools`, `modelsched.ModelPlanner`, `sessions.Sessions`). Capacity facts (what
could ever fit where, the largest capacity) are caches of the nodes, dropped by
`capacity_changed` whenever a node comes or goes.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from .cluster import ClusterSpec, ModelSpec
from .commands import Command
from .config import CoreConfig
from .estimator import DurationEstimator
from .nodeindex import FreeIndex
from .policies import POLICY_TABLE, Policy
from .records import ActionRecord, NodeState, QueueKey, SessionRecord, ShapeKey
from .resources import Resources


class ParkedGroup:
    """A node's parked session heads of one demand shape (`CoreState.park`): the memory each
    needs, whether they are rigid, a heap of ``(rank, seq, session id)`` in the queues' order,
    and its size at its last compaction."""

    __slots__ = ("heap", "kept", "need", "rigid")

    def __init__(self, need: float, rigid: bool) -> None:
        self.need = need
        self.rigid = rigid
        self.heap: list[tuple[int, int, str]] = []
        self.kept = 0


class CoreState:
    """The core's shared records and the event in progress (see the module's docstring)."""

    def __init__(self, cluster: ClusterSpec, config: CoreConfig) -> None:
        self.config = config
        self.policy: Policy = POLICY_TABLE[config.policy]
        self.cluster = cluster
        self.models: dict[str, ModelSpec] = {m.name: m for m in cluster.models}
        self.nodes: dict[str, NodeState] = {}
        self.index = FreeIndex()  # alive nodes by free CPU
        self.estimator = DurationEstimator()
        self.actions: dict[str, ActionRecord] = {}  # live actions
        self.sessions: dict[str, SessionRecord] = {}  # open sessions and those waiting for room
        # node -> the sessions opened there that may have queued actions: every session on the
        # node whose queue is not empty is in it (added as it opens and as its queue fills,
        # dropped lazily by the pass: `SchedulingPass.candidates`), so the pass over a node
        # whose capacity grew looks at its waiting sessions, not at all it holds (issue 40)
        self.waiting_on: dict[str, set[str]] = {}
        # Sessions parked out of `waiting_on` (issue 40): the head of each lacked memory on its
        # node when the pass last looked (`SchedulingPass.run_pass` left it out), and nothing
        # it needs has changed since. sid -> its head's (shape, seq); node -> its groups of
        # parked heads by (shape, rigid), each a heap in the queues' order from which the pass
        # over the node takes heads as long as its free memory fits them (`SchedulingPass
        # .run_pass`; an entry whose session is no longer parked with that head is stale,
        # skipped). `unpark` puts a session back in its node's set when its queue is touched
        # (a new head, an aged one, an action taken off) or its head starts.
        self.parked: dict[str, tuple[tuple[tuple[str, float], ...], int]] = {}  # sid -> (shape, seq)
        self.short_on: dict[str, dict[tuple[tuple[tuple[str, float], ...], bool], ParkedGroup]] = {}
        self.now = 0.0  # the time of the latest event
        self.out: list[Command] = []  # the commands of the event in progress
        self.cause = ""  # the cause those commands carry
        self.start_index: dict[str, int] = {}  # action id -> its StartAction's place in `out`
        self.dirty: set[str] = set()  # nodes whose free capacity grew in this event
        self.touched: set[QueueKey] = set()  # queues whose head may have changed in this event
        self.models_touched: set[str] = set()  # models whose queue or instances changed
        self.expand_at: set[str] = set()  # nodes where elastic expansion may look
        # Nodes where an elastic action started since a scan of the node last found none
        # running (placement adds, expansion drops): no other node runs one.
        self.elastic_nodes: set[str] = set()
        self.reserved: dict[str, str] = {}  # node -> the aged action it is held for
        # capacity facts, dropped by `capacity_changed`
        # demand key (a `ShapeKey`, a model's `ModelKey`, a demand's sorted items) -> some
        # alive node could ever fit it
        self.fits_some: dict[Hashable, bool] = {}
        self.shares: dict[ShapeKey, float] = {}  # demand shape -> dominant share of `largest`
        self._largest: dict[str, float] | None = None  # (None: recompute)
        policy = self.policy
        self.elastic_policy = policy.elastic
        self.partitioned = policy.partitioned is not None
        self.resident = policy.resident
        # Fair share between tenants (`CoreConfig.tenant_shares`; docs/core.md, "Tenants' fair
        # share"): what each tenant's actions hold on the nodes now (their allotments, or
        # charges), and the weights; `tenant_rank` orders the tenants in the pass.
        shares = config.tenant_shares
        self.fair = bool(shares)
        self.tenant_weights: dict[str, float] = dict(shares) if shares else {}
        self.default_weight = min(self.tenant_weights.values()) if shares else 1.0
        self.tenant_use: dict[str, dict[str, float]] = {}
        self._total: dict[str, float] | None = None  # (None: recompute)

    # ---- sessions parked for memory (issue 40) ---------------------------------------------------
    def park(self, sid: str, node: str, shape: tuple[tuple[str, float], ...], need: float,
             rigid: bool, rank: int, seq: int) -> None:
        """Session ``sid``'s head (queue entry ``rank``, ``seq``; demand ``shape``, of which
        ``need`` MB of memory) lacks memory on ``node``: out of the node's `waiting_on`, into
        the node's group of parked heads of that shape, which the passes over the node look at
        while its free memory fits ``need`` (`SchedulingPass.run_pass`), until its queue
        changes or its head starts (`unpark`)."""
        self.parked[sid] = (shape, seq)
        self.waiting_on[node].discard(sid)  # (made as its first session opened there)
        groups = self.short_on.get(node)
        if groups is None:
            groups = self.short_on[node] = {}
        group = groups.get((shape, rigid))
        if group is None:
            group = groups[(shape, rigid)] = ParkedGroup(need, rigid)
        heap = group.heap
        heapq.heappush(heap, (rank, seq, sid))
        if len(heap) > 2 * group.kept + 32:  # stale entries pile up: keep the live ones (amortized O(1))
            live: set[tuple[int, int, str]] = set()
            for e in heap:
                if self._parked_here(e[2], shape, e[1], node):
                    live.add(e)
            heap[:] = sorted(live)
            group.kept = len(heap)

    def _parked_here(self, sid: str, shape: tuple[tuple[str, float], ...], seq: int, node: str) -> bool:
        """Whether a group entry is live: its session parked with that head, on that node."""
        sess = self.sessions.get(sid)
        return self.parked.get(sid) == (shape, seq) and sess is not None and sess.node == node

    def unpark(self, sid: str) -> None:
        """Session ``sid`` back in its node's `waiting_on` (the pass looks at it again), if parked."""
        if self.parked.pop(sid, None) is None:
            return
        sess = self.sessions.get(sid)
        if sess is not None and sess.node is not None:
            self.waiting_on[sess.node].add(sid)

    def next_parked(self, node: str, shape: tuple[tuple[str, float], ...], group: ParkedGroup,
                    ) -> tuple[int, int, str] | None:
        """Off ``group``'s heap (``node``'s heads of ``shape``), its first live entry in the
        queues' order, the stale ones before it dropped; None when it has no more."""
        heap = group.heap
        while heap:
            e = heapq.heappop(heap)
            if self._parked_here(e[2], shape, e[1], node):
                return e
        return None

    # ---- the event in progress ------------------------------------------------------------------

    def begin(self, time: float, cause: str) -> list[Command]:
        """Start an event at ``time`` (the clock never goes back): a fresh command list."""
        if time > self.now:
            self.now = time
        self.cause = cause
        out: list[Command] = []
        self.out = out
        if self.start_index:
            self.start_index = {}
        return out

    def recause(self, cause: str) -> None:
        """The cause of the commands that follow (one event that carries several actions)."""
        self.cause = cause

    def end(self) -> None:
        """The event is done: its command list belongs to the caller now."""
        self.out = []

    # ---- capacity facts -------------------------------------------------------------------------
    def capacity_changed(self) -> None:
        self.fits_some.clear()
        self.shares.clear()
        self._largest = None
        self._total = None

    def largest(self) -> dict[str, float]:
        """The largest capacity of an alive node, per dimension (cached)."""
        ref = self._largest
        if ref is None:
            ref = self._largest = largest_capacity(self.nodes.values())
        return ref

    # ---- tenants' fair share ---------------------------------------------------------------------
    def total(self) -> dict[str, float]:
        """The alive nodes' capacity summed, per dimension (cached): DRF's denominators."""
        ref = self._total
        if ref is None:
            ref = {}
            for n in self.nodes.values():
                if n.alive:
                    for k, v in n.cap.items():
                        ref[k] = ref.get(k, 0.0) + v
            self._total = ref
        return ref

    def tenant_weight(self, tenant: str) -> float:
        got = self.tenant_weights.get(tenant)
        return self.default_weight if got is None else got

    def tenant_rank(self, tenant: str) -> float:
        """``tenant``'s dominant share (the largest fraction of the cluster's capacity in any
        dimension that its running actions hold) over its weight: DRF serves the lowest first."""
        use = self.tenant_use.get(tenant)
        if not use:
            return 0.0
        total = self.total()
        top = 0.0
        for k, v in use.items():
            c = total.get(k, 0.0)
            if c > 0.0:
                f = v / c
                if f > top:
                    top = f
        return top / self.tenant_weight(tenant)

    def tenant_take(self, tenant: str, r: dict[str, float], sign: float) -> None:
        """``tenant``'s actions hold ``sign`` x ``r`` more (a start: +1, an end: -1, an elastic
        width change: either)."""
        use = self.tenant_use.get(tenant)
        if use is None:
            use = self.tenant_use[tenant] = {}
        for k, v in r.items():
            u = use.get(k, 0.0) + sign * v
            use[k] = u if u > 1e-9 else 0.0

    def share_of(self, rec: ActionRecord) -> float:
        """The dominant share of ``rec``'s demand shape against `largest` (cached per shape)."""
        share = self.shares.get(rec.skey)
        if share is None:
            share = self.shares[rec.skey] = rec.spec.demand.dominant_share(self.largest())
        return share

    def fits_some_node(self, demand: Resources, key: Hashable) -> bool:
        ok = self.fits_some.get(key)
        if ok is None:
            ok = any(n.alive and demand.fits_in(n.cap) for n in self.nodes.values())
            self.fits_some[key] = ok
        return ok

    def expected_work(self, rec: ActionRecord) -> float:
        """Expected work of an action (seconds at speed 1): the estimator's mean, else its
        estimate."""
        got = self.estimator.mean_work(rec.ekey, rec.units)
        return rec.est if got is None else got


def largest_capacity(nodes: Iterable[NodeState]) -> dict[str, float]:
    ref: dict[str, float] = {}
    for n in nodes:
        if n.alive:
            for k, v in n.cap.items():
                if v > ref.get(k, 0.0):
                    ref[k] = v
    return ref
