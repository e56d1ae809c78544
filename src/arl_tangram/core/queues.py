"""The queues: one heap per queue key, their order, aging, and when an elastic head is overdue.

Invariant: a QUEUED action has exactly one fresh entry, in the heap of its ``queue_key``
(``rec.gen`` equals the entry's ``gen``); `live` counts those per key and drops a key with
none; `shape_keys` holds exactly the shared-pool keys (`ShapeKey`) with live entries. Entries
go stale lazily (a bumped ``gen``) and `head` pops them.

Queues are heaps of ``(rank, seq, gen, id)``: ``rank`` is ``AGED`` once an action has waited
`aging_after` (aged entries come first, oldest first), else its priority class as an int
(`rank`). Ints, not floats, because the heaps compare entries on every push and pop; small
ones for the usual classes, because CPython shares small int objects and a tuple comparison
passes over identical items without comparing them. Actions of the shared pool are queued per
*demand shape* (`ShapeKey`), so one pass costs O(shapes + placements), never O(pending): a
blocked head blocks its whole shape.
"""

from __future__ import annotations

import heapq
import math

from .actions import Status
from .records import (
    ActionRecord,
    QueueKey,
    SessionKey,
    ShapeKey,
    is_model_key,
    is_session_key,
    model_key,
    partition_key,
    session_key,
)
from .resources import CPU
from .state import CoreState

_QUEUED = Status.QUEUED  # (a module constant: cheaper than Status.QUEUED)
Entry = tuple[int, int, int, str]  # (rank, seq, gen, id)
_SQRT_HALF = math.sqrt(0.5)
# rank of priority class c (2 * exponent + half-octave bit, >= -2146 for any float > 0) is
# c + _RANK0 (usual classes, -40..20, give ranks CPython keeps one object each of: -5..256);
# an expected work of 0 ranks _RANK_NONE (first among the non-aged), an aged entry AGED
_RANK0 = 50
_RANK_NONE = -3000
AGED = -4000


def between(x: float, lo: float, hi: float) -> float:
    """``min(hi, max(lo, x))`` (``hi`` wins when ``lo > hi``), without the builtins' calls."""
    x = x if x > lo else lo
    return x if x < hi else hi


def head_need(rec: ActionRecord, elastic_policy: bool) -> float:
    """The least CPU waiting ``rec`` needs to start: a rigid action its demand's, an elastic
    one under an elastic policy (the lane rule's) its minimum, none where it stretches in
    another dimension."""
    if rec.elastic and elastic_policy:
        return rec.el_min if rec.el_cpu else 0.0
    return rec.spec.demand.get(CPU, 0.0)


class HeadStream:
    """A node's waiting sessions' heads in the pass's order (issue 40): a heap of
    ``(rank, seq, gen, sid)``, the queue entry of each session's head as it was pushed. Every
    waiting session on the node that is not parked has its head's entry here; the others go
    stale (its head changed, it started, its session parked, closed or moved) and are dropped
    as they are popped or when the heap is rebuilt (`Queues.to_stream`). A pass over the node
    takes its heads off one at a time in order (`SchedulingPass.run_pass`), not all of them:
    a crowded node's pass built a heap of its thousands of waiting heads to start one or none.
    ``need`` and ``elastic``: the least CPU an entry pushed since the last rebuild needs (a
    rigid head its demand, an elastic one its minimum) and whether one was elastic -- bounds
    for the heads in it (`scheduling._ShortNodes`)."""

    def __init__(self) -> None:
        self.heap: list[Entry] = []
        self.kept = 0  # entries after the last rebuild
        self.need = math.inf
        self.elastic = False

    def bound(self, rec: ActionRecord, elastic_policy: bool) -> None:
        """The bounds widened to hold head ``rec``: its need, and whether it is elastic."""
        if rec.elastic and elastic_policy:
            self.elastic = True
        need = head_need(rec, elastic_policy)
        if need < self.need:  # pragma: no mutate (<=: the same value kept)
            self.need = need


class Queues:
    """Every queue of the core: shared-pool shapes, sessions, partitions, models."""

    def __init__(self, st: CoreState) -> None:
        self.st = st
        self.heaps: dict[QueueKey, list[Entry]] = {}  # queue key -> its heap
        self.live: dict[QueueKey, int] = {}  # queue key -> its fresh entries (keys with none dropped)
        self.shape_keys: dict[ShapeKey, float] = {}  # shared-pool queues with live entries -> their cpu
        self.aging_heap: list[tuple[float, int, str]] = []  # (when it ages, seq, id)
        # The entries of this event's enqueues, pushed at its end for those still queued
        # (`park_aging`): most actions start in the event they arrive in, and an entry pushed
        # for each would wait on the heap for its time only to be popped as stale.
        self.aging_new: list[tuple[float, int, str]] = []
        self.aging_through = -math.inf  # the time up to which the aging heap has been popped
        # (when, seq, id) of queued elastic actions: when each will have waited its expected
        # run at its maximum (`overdue_from`)
        self.overdue_heap: list[tuple[float, int, str]] = []
        self.aged_pushes = 0  # aged queue entries ever pushed (0: every live head is non-aged)
        # (estimator key, units) -> (rank, id) of the last action of that work enqueued: FIFO
        # among actions of the same work (`fifo_rank`)
        self._fifo_floors: dict[tuple[object, ...], tuple[int, str]] = {}
        # partition -> the session queues holding its actions
        self.partition_sessions: dict[str, set[SessionKey]] = {}
        # sessions with queued actions: a pass after capacity freed on a node looks at its
        # sessions among these, not at every session open there (`SchedulingPass.candidates`)
        self.waiting_sessions: set[str] = set()
        # Tenants' fair share of a model's batches (`CoreConfig.tenant_shares`): model queue
        # key -> tenant -> its heap (`heaps` then holds none of that key), and (model,
        # tenant) -> its finish tag (`_model_head`, `_served`)
        self.mheaps: dict[QueueKey, dict[str, list[Entry]]] = {}
        self._mfinish: dict[tuple[str, str], int] = {}
        self.streams: dict[str, HeadStream] = {}  # node -> its waiting sessions' heads

    # ---- keys and order -------------------------------------------------------------------------
    def key_of(self, rec: ActionRecord) -> QueueKey:
        spec = rec.spec
        if rec.is_model:
            return model_key(spec.model or "")  # (one without a model was rejected on arrival)
        if spec.session is not None:
            return session_key(spec.session)
        if rec.partition is not None:
            return partition_key(rec.partition)
        return rec.skey  # its shape's `ShapeKey`

    def rank(self, rec: ActionRecord) -> int:
        """Expected work x resources held / weight, in half-octave classes (FIFO inside one),
        as a queue entry's rank (> `AGED`; arrival order alone, rank 1, for unordered policies).

        The classes keep actions of one kind in arrival order while their estimates drift a
        little as the estimator learns; only a real difference in size (>= ~1.4x) reorders.
        """
        st = self.st
        if not st.policy.ordered:
            return 1
        share = 0.0 if rec.is_model else st.share_of(rec)
        x = rec.est * (1e-3 if share < 1e-3 else share) / rec.spec.weight  # max(share, 1e-3)
        if x <= 0.0:
            return _RANK_NONE
        m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
        return 2 * e + (m >= _SQRT_HALF) + _RANK0

    def fifo_rank(self, rec: ActionRecord) -> int:
        """`rank`, never below the rank of a still-queued earlier action of the same work
        (estimator key and units) and weight: as the estimate drifts across a class boundary,
        actions of one kind stay in arrival order instead of later ones overtaking earlier ones
        until those age (a p99 of `aging_min_s` under sustained load of identical requests); a
        heavier action still overtakes (the weight is not drift)."""
        rank = self.rank(rec)
        if rank <= _RANK_NONE or not self.st.policy.ordered:
            return rank
        floors = self._fifo_floors
        group: tuple[object, ...] = (rec.ekey, rec.units, rec.spec.weight)  # (a heavier action may overtake)
        if self.st.fair:
            group = (*group, rec.tenant)  # (in its tenant's order only: fair share)
        got = floors.get(group)
        if got is not None and got[0] > rank:
            last = self.st.actions.get(got[1])
            if last is not None and last.status is _QUEUED:
                rank = got[0]
        if got is None and len(floors) >= 4096:
            floors.clear()  # (bounded: units may take many values; a floor matters while queued)
        floors[group] = (rank, rec.spec.id)
        return rank

    def aging_after(self, rec: ActionRecord) -> float:
        """How long ``rec`` may wait before it is served ahead of every non-aged action:
        `aging_relative` times its expected run, at least `aging_min_s`, at most `aging_s` and
        half its own timeout (above `aging_min_s`): ordering never holds an action back until
        its caller gives up (a /run_code answers 504 after its timeouts and a grace)."""
        cfg = self.st.config
        lo, hi = cfg.aging_min_s, cfg.aging_s
        half = 0.5 * rec.spec.timeout_s
        if half < hi:
            hi = half if half > lo else lo
        return between(cfg.aging_relative * rec.est, lo, hi)

    def overdue_from(self, rec: ActionRecord) -> float:
        """When queued elastic ``rec`` becomes overdue (it then starts at whatever width it
        can get): its submit plus its expected run at its maximum."""
        el = rec.spec.elasticity
        assert el is not None
        return rec.submit_time + self.st.expected_work(rec) / max(el.speedup.factor(el.max), 1e-9)

    # ---- in and out -----------------------------------------------------------------------------
    def enqueue(self, rec: ActionRecord) -> None:
        st = self.st
        spec = rec.spec
        shared = not rec.is_model and spec.session is None and rec.partition is None
        key: QueueKey = rec.skey if shared else self.key_of(rec)
        rec.queue_key = key
        gen = rec.gen = rec.gen + 1
        seq = rec.seq
        aging_after = self.aging_after(rec)
        aged = st.now - rec.submit_time >= aging_after
        if aged:
            entry = (AGED, seq, gen, spec.id)
            self.aged_pushes += 1
        else:
            entry = (self.fifo_rank(rec), seq, gen, spec.id)
        if st.fair and rec.is_model:  # (tenants: a heap per tenant, `_model_head`)
            subs = self.mheaps.get(key)
            if subs is None:
                subs = self.mheaps[key] = {}
            q = subs.get(rec.tenant)
            if q is None:
                q = subs[rec.tenant] = []
        else:
            q = self.heaps.get(key)
            if q is None:
                q = self.heaps[key] = []
        heapq.heappush(q, entry)
        live = self.live
        before = live.get(key, 0)
        live[key] = before + 1
        look = True
        if shared:
            skey = rec.skey  # (`key`)
            self.shape_keys[skey] = rec.cpu
            # With a live action of this shape queued, the last pass left the queue's head
            # blocked: no alive node outside the reservations fits the shape (work
            # conservation). With no capacity freed since (nothing dirty), a non-aged action of
            # the shape is blocked too, head or not: the queue needs no look.
            # (An elastic head may wait by choice, not for room, and its choice depends on
            # how many wait: its queue is always worth a look.)
            look = not before or aged or bool(st.dirty) or (skey.elastic and st.elastic_policy)
        elif is_session_key(key):
            if not before:
                sid = key[1]
                self.waiting_sessions.add(sid)
                sess = st.sessions.get(sid)
                if sess is not None and sess.node is not None:  # (its node's set: made as it opened)
                    st.waiting_on[sess.node].add(sid)
            if rec.partition is not None:
                self.partition_sessions.setdefault(rec.partition, set()).add(key)
        elif is_model_key(key):
            st.models_touched.add(key[1])
        # Every head is blocked after a pass; an entry that does not become the head cannot
        # change that, so only a new head makes its queue worth a look.
        if look and self._is_head(key, q, seq, gen):
            st.touched.add(key)
        parked = rec.aging_parked
        if parked is not None:  # its entries the heap would still hold: back on it
            rec.aging_parked = None
            for due in parked:
                if due > self.aging_through:
                    heapq.heappush(self.aging_heap, (due, seq, spec.id))
        if not aged:
            due = rec.submit_time + aging_after
            if due > st.now:
                self.aging_new.append((due, seq, spec.id))
            else:  # (rounding: due already, this event's aging step must see it)
                heapq.heappush(self.aging_heap, (due, seq, spec.id))
        if rec.elastic and st.elastic_policy:
            heapq.heappush(self.overdue_heap, (self.overdue_from(rec), seq, spec.id))

    def _is_head(self, key: QueueKey, q: list[Entry], seq: int, gen: int) -> bool:
        """Whether the entry ``(seq, gen)`` just pushed on ``q`` is its queue's head (what
        `head` returns), stale entries above it popped. Compared by (seq, gen), which no other
        entry has: compiled, a tuple of fixed shape is unboxed, and the heap holds a boxed copy,
        never the pushed tuple itself."""
        e0 = q[0]
        if e0[1] == seq and e0[2] == gen:
            return True
        r0 = self.st.actions.get(e0[3])
        if r0 is None or r0.gen != e0[2] or r0.queue_key != key:  # a stale head: `head` pops it
            got = self.head(key)
            return got is not None and got[1][1] == seq and got[1][2] == gen
        return False

    def dequeue(self, rec: ActionRecord) -> None:
        """Take a queued action off its queue (cancelled, failed, batched); a session or
        partition queue is touched (its next head may fit where this one did not)."""
        key = rec.queue_key
        if self._leave(rec) and key is not None and type(key) is not ShapeKey and not is_model_key(key):
            # a session or partition queue holds actions of several shapes: the next
            # head may fit where this one did not
            self.st.touched.add(key)

    def started(self, rec: ActionRecord) -> None:
        """Take an action that starts off its queue (the pass looks at its queue next)."""
        self._leave(rec)

    def _leave(self, rec: ActionRecord) -> bool:
        """Off its queue, its node reservations dropped; whether its queue still has others."""
        key = rec.queue_key
        n = -1
        if self.mheaps and key is not None:
            subs = self.mheaps.get(key)
            if subs is not None:
                self._served(key[1], rec.tenant, subs)
        if key is not None:
            live = self.live
            n = live.get(key, 0) - 1
            if n <= 0:
                live.pop(key, None)
                if type(key) is ShapeKey:
                    self.shape_keys.pop(key, None)
                self.heaps.pop(key, None)
                if self.mheaps:
                    self.mheaps.pop(key, None)
                if is_session_key(key):
                    sid = key[1]
                    self.waiting_sessions.discard(sid)
                    if self.st.parked:
                        self.st.parked.pop(sid, None)  # (nothing waits: not parked either)
                    sess = self.st.sessions.get(sid)
                    if sess is not None and sess.node is not None:
                        self.st.waiting_on[sess.node].discard(sid)
            else:
                live[key] = n
        rec.queue_key = None
        rec.gen += 1
        if n > 0 and key is not None and is_session_key(key):  # pragma: no mutate (n == 0 too: no head, nothing pushed)
            self.to_stream(key[1])  # (its next head, if it was the head: a pass looks at it)
        reserved = self.st.reserved
        if reserved:
            for name in [n for n, a in reserved.items() if a == rec.spec.id]:
                del reserved[name]
                # (open to others again: the pass looks there, even when nothing else changed --
                # a cancelled aged head left a held core idle until the next event)
                self.st.dirty.add(name)
        return n > 0

    def head(self, key: QueueKey) -> tuple[ActionRecord, Entry] | None:
        if self.mheaps:
            subs = self.mheaps.get(key)
            if subs is not None:
                return self._model_head(key, subs)
        q = self.heaps.get(key)
        actions = self.st.actions
        while q:
            e = q[0]
            rec = actions.get(e[3])
            if rec is not None and rec.gen == e[2] and rec.queue_key == key:
                return rec, e
            heapq.heappop(q)
        return None

    def to_stream(self, sid: str) -> None:
        """Session ``sid``'s head onto its node's `HeadStream`, where its head may have
        changed (`_leave`; `Core`'s flush for a touched session queue: an arrival, an aged or
        a removed action, an opened or unparked session). A parked session's is not: its
        unpark puts it there. An entry already there is pushed again (a copy: the pass takes
        one, `stream_head` drops the rest); past twice the entries of the last rebuild (and 32),
        the heap is rebuilt from its live entries (amortized O(1) a push)."""
        st = self.st
        sess = st.sessions.get(sid)
        if sess is None or sess.node is None or sid in st.parked:
            return
        got = self.head(session_key(sid))
        if got is None:
            return
        rec, e = got
        name = sess.node
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = HeadStream()
        heap = stream.heap
        heapq.heappush(heap, (e[0], e[1], e[2], sid))
        stream.bound(rec, st.elastic_policy)
        if len(heap) > 2 * stream.kept + 32:
            self._rebuild(name, stream)

    def _rebuild(self, name: str, stream: HeadStream) -> None:
        """``stream`` (node ``name``'s) down to its live entries, once each; its bounds anew."""
        live: dict[Entry, ActionRecord] = {}
        for e in stream.heap:
            rec = self.stream_head(name, e)
            if rec is not None:
                live[e] = rec
        entries = list(live)
        heapq.heapify(entries)  # (O(n), not a sort: the entries are distinct, so the pops' order is the same)
        stream.heap[:] = entries  # (in place: a pass may hold the list)
        stream.kept = len(live)
        stream.need = math.inf
        stream.elastic = False
        elastic_policy = self.st.elastic_policy
        for rec in live.values():
            stream.bound(rec, elastic_policy)

    def stream_head(self, name: str, e: Entry) -> ActionRecord | None:
        """The head a `HeadStream` entry ``e`` of node ``name`` stands for, if the entry is
        live: its session open on ``name``, not parked, and ``e`` its queue's head entry."""
        st = self.st
        sid = e[3]
        sess = st.sessions.get(sid)
        if sess is None or sess.node != name or (st.parked and sid in st.parked):
            return None
        got = self.head(session_key(sid))
        if got is None:
            return None
        h = got[1]
        return got[0] if h[1] == e[1] and h[2] == e[2] else None

    def _model_head(self, key: QueueKey, subs: dict[str, list[Entry]]
                    ) -> tuple[ActionRecord, Entry] | None:
        """A model queue's head with tenants: the head of the tenant with the least finish tag
        (self-clocked fair queueing, `_served`), inside it the usual order (aged first, then
        rank, then arrival); ties to the better head. One tenant: its heap's head, as without."""
        actions = self.st.actions
        model = key[1]
        best: tuple[int, int, int] | None = None
        got: tuple[ActionRecord, Entry] | None = None
        for t, q in list(subs.items()):
            while q:
                e = q[0]
                rec = actions.get(e[3])
                if rec is not None and rec.gen == e[2] and rec.queue_key == key:
                    break
                heapq.heappop(q)
            if not q:
                del subs[t]
                continue
            e = q[0]
            mine = (self._mfinish.get((model, t), 0), e[0], e[1])
            if best is None or mine < best:
                best = mine
                got = (actions[e[3]], e)
        return got

    def _served(self, model: str, tenant: str, subs: dict[str, list[Entry]]) -> None:
        """One of ``tenant``'s actions leaves ``model``'s queue (into a batch, or cancelled):
        its finish tag moves on by 1000 / its weight, from at least the least tag of the other
        tenants waiting (a tenant back from idle has no credit saved: self-clocked fair
        queueing, Golestani 1994; start-time fair queueing, Goyal et al. 1996)."""
        lo = -1
        for t in subs:
            if t != tenant:
                f = self._mfinish.get((model, t), 0)
                if lo < 0 or f < lo:
                    lo = f
        k = (model, tenant)
        f = self._mfinish.get(k, 0)
        if lo > f:
            f = lo
        cost = round(1000.0 / self.st.tenant_weight(tenant))
        self._mfinish[k] = f + (cost if cost > 1 else 1)

    def queued_elastic(self) -> int:
        """Elastic actions waiting in the shared pool's queues."""
        n = 0
        live = self.live
        for key in self.shape_keys:
            if key.elastic:
                n += live.get(key, 0)
        return n

    # ---- time -----------------------------------------------------------------------------------
    def age(self) -> None:
        """Actions that waited their `aging_after`: served first from now on."""
        st = self.st
        heap, now = self.aging_heap, st.now
        while heap and heap[0][0] <= now:
            _, seq, aid = heapq.heappop(heap)
            rec = st.actions.get(aid)
            if rec is None or rec.seq != seq or rec.status is not _QUEUED:
                continue
            key = rec.queue_key
            assert key is not None  # (QUEUED: in a queue)
            rec.gen += 1
            subs = self.mheaps.get(key) if self.mheaps else None
            if subs is not None:  # (a model queue with tenants: aged inside its tenant's heap)
                q = subs.get(rec.tenant)
                if q is None:
                    q = subs[rec.tenant] = []
                heapq.heappush(q, (AGED, rec.seq, rec.gen, aid))
            else:
                heapq.heappush(self.heaps[key], (AGED, rec.seq, rec.gen, aid))
            self.aged_pushes += 1
            rec.note(now, "aged", "aging")
            st.touched.add(key)
            if is_model_key(key):
                st.models_touched.add(key[1])

    def age_until(self, now: float) -> None:
        """The aging phase of an event: age what is due by ``now``; the heap has been popped
        through ``now`` (`park_aging` does not put back what it would have popped)."""
        heap = self.aging_heap
        if heap and heap[0][0] <= now:
            self.age()
        self.aging_through = now

    def park_aging(self) -> None:
        """End of an event: this event's aging entries go on the heap for the actions still
        queued; one that started keeps its due time on its record (`aging_parked`), for a
        requeue. The heap pops in the same order and ages the same actions as if every entry
        had been pushed at its enqueue: an entry of an action that is not queued is skipped
        when popped, and one that would have been popped before its action's requeue (due at
        or before `aging_through`) is not put back."""
        actions = self.st.actions
        heap = self.aging_heap
        for entry in self.aging_new:
            rec = actions.get(entry[2])
            if rec is None or rec.seq != entry[1]:
                continue  # gone: its entry would be skipped
            if rec.status is _QUEUED:
                heapq.heappush(heap, entry)
            else:
                parked = rec.aging_parked
                rec.aging_parked = (entry[0],) if parked is None else (*parked, entry[0])
        self.aging_new.clear()

    def wake_overdue(self) -> None:
        """Queued elastic actions that became overdue since the last event: their queues are
        worth a look (the pass may now start them narrow)."""
        st = self.st
        heap, now = self.overdue_heap, st.now
        while heap and heap[0][0] <= now:
            _, seq, aid = heapq.heappop(heap)
            rec = st.actions.get(aid)
            if rec is not None and rec.seq == seq and rec.queue_key is not None:
                st.touched.add(rec.queue_key)

    def session_queues_of(self, partition: str) -> set[SessionKey]:
        """The session queues of ``partition`` that still hold actions."""
        keys = self.partition_sessions.get(partition)
        if not keys:
            return set()
        keys.intersection_update(self.live)
        return keys
