# mypy: disable-error-code="misc"
"""The scheduling pass: queues, ordering, aging, and which queue heads are tried where.

Invariant: after `_schedule` returns, every queue's head is blocked -- no queued action of the
shared pool fits any alive node that is not reserved for an aged action (work conservation),
and a partition or session queue's head does not fit where it may go.

Where a head goes (node choice, starting it, reservations, warm executors) is `placement.py`.
Queues are heaps of ``(rank, seq, gen, id)``: ``rank`` is ``_AGED`` once an action has waited
``_aging_after`` (aged entries come first, oldest first), else its priority class as an int
(`_rank`). Ints, not floats, because the heaps compare entries on every push and pop; small
ones for the usual classes, because CPython shares small int objects and a tuple comparison
passes over identical items without comparing them. Entries go stale lazily (``gen``). Actions
of the shared pool are queued per *demand shape* (`ShapeKey`), so one pass costs O(shapes +
placements), never O(pending): a blocked head blocks its whole shape.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

from .actions import Status
from .nodeindex import FreeIndex
from .records import ActionRecord, NodeState, ShapeKey
from .resources import CPU

if TYPE_CHECKING:
    from .core import Core

S = Status
_QUEUED = S.QUEUED  # (a module constant: cheaper than S.QUEUED)
Entry = tuple[int, int, int, str]  # (rank, seq, gen, id)
_SQRT_HALF = math.sqrt(0.5)
# rank of priority class c (2 * exponent + half-octave bit, >= -2146 for any float > 0) is
# c + _RANK0 (usual classes, -40..20, give ranks CPython keeps one object each of: -5..256);
# an expected work of 0 ranks _RANK_NONE (first among the non-aged), an aged entry _AGED
_RANK0 = 50
_RANK_NONE = -3000
_AGED = -4000


@trait  # (a part of `Core`: mypyc compiles it into that class; see `_native.py`)
class SchedulingMixin:
    """Part of `Core`: everything between a queued action and a StartAction."""

    def _init_scheduling(self: Core) -> None:
        self.queues: dict[Any, list[Entry]] = {}
        self.qlive: dict[Any, int] = {}
        self.shape_keys: dict[Any, float] = {}  # shared-pool queues with live entries -> their cpu
        self.aging_heap: list[tuple[float, int, str]] = []
        # (when, seq, id) of queued elastic actions: when each will have waited its expected run
        # at its maximum (`_overdue`, elastic.py)
        self._overdue_at: list[tuple[float, int, str]] = []
        # queues whose elastic head waits for a node warm for it (`_choose_elastic`), and
        # those to look at again because a warm pool ran dry (`_set_warm`)
        self._warm_waiters: dict[Any, None] = {}
        self._rewake: set[Any] = set()
        self._aged_pushes = 0  # aged queue entries ever pushed (0: every live head is non-aged)
        # (estimator key, units) -> (rank, id) of the last action of that work enqueued: FIFO
        # among actions of the same work (`_fifo_rank`)
        self._fifo_floor: dict[Any, tuple[int, str]] = {}
        # warm key -> nodes with a warm executor for it; insertion-ordered (a dict, not a set) so
        # that ties between equally good warm nodes break the same way in every process
        self.warm_nodes: dict[str, dict[str, None]] = {}
        self.partitions: dict[str, list[tuple[str, float]]] = {}
        self.part_by_node: dict[str, list[str]] = {}
        self._parts_dirty = True
        self.part_quota: dict[tuple[str, str], float] = {}
        self.part_index: dict[str, FreeIndex] = {}
        self.part_used: dict[tuple[str, str], float] = {}
        self.part_running: dict[str, int] = {}
        self.part_members: dict[str, tuple[str, str, float]] = {}
        self.part_sess: dict[str, set[Any]] = {}  # partition -> session queues holding its actions
        self.traj_slot: dict[str, str] = {}
        self.traj_node: dict[str, str] = {}
        self.rate_counts: dict[str, int] = {}
        self._recent: dict[str, deque[float]] = {}
        self._window_peak: dict[str, float] = {}
        self.rates: dict[str, float] = {}
        self.rate_peaks: dict[str, float] = {}
        self.last_rate_time: float | None = None
        self.warm_sent: dict[tuple[str, str], int] = {}
        self._warm_names: list[str] | None = None  # CPU nodes warm pools spread over
        self._warm_want: dict[str, int] = {}  # key -> warm executors last spread over them

    # ---- queues ---------------------------------------------------------------------------------
    def _queue_key(self: Core, rec: ActionRecord) -> Any:
        spec = rec.spec
        if rec.is_model:
            return ("model", spec.model)
        if spec.session is not None:
            return ("sess", spec.session)
        if rec.partition is not None:
            return ("part", rec.partition)
        return rec.skey  # its shape's `ShapeKey`

    def _rank(self: Core, rec: ActionRecord) -> int:
        """Expected work x resources held / weight, in half-octave classes (FIFO inside one),
        as a queue entry's rank (> `_AGED`; arrival order alone, rank 1, for unordered policies).

        The classes keep actions of one kind in arrival order while their estimates drift a
        little as the estimator learns; only a real difference in size (>= ~1.4x) reorders.
        """
        if not self.policy.ordered:
            return 1
        share: float | None
        if rec.is_model:
            share = 0.0
        else:
            share = self.share_of(rec)
        x = rec.est * (1e-3 if share < 1e-3 else share) / rec.spec.weight  # max(share, 1e-3)
        if x <= 0.0:
            return _RANK_NONE
        m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
        return 2 * e + (m >= _SQRT_HALF) + _RANK0

    def _fifo_rank(self: Core, rec: ActionRecord) -> int:
        """`_rank`, never below the rank of a still-queued earlier action of the same work
        (estimator key and units) and weight: as the estimate drifts across a class boundary,
        actions of one kind stay in arrival order instead of later ones overtaking earlier ones
        until those age (a p99 of `aging_min_s` under sustained load of identical requests); a
        heavier action still overtakes (the weight is not drift)."""
        rank = self._rank(rec)
        if rank <= _RANK_NONE or not self.policy.ordered:
            return rank
        floors = self._fifo_floor
        group = (rec.ekey, rec.units, rec.spec.weight)  # (a heavier action may overtake)
        got = floors.get(group)
        if got is not None and got[0] > rank:
            last = self.actions.get(got[1])
            if last is not None and last.status is _QUEUED:
                rank = got[0]
        if got is None and len(floors) >= 4096:
            floors.clear()  # (bounded: units may take many values; a floor matters while queued)
        floors[group] = (rank, rec.spec.id)
        return rank

    def _aging_after(self: Core, rec: ActionRecord) -> float:
        """How long ``rec`` may wait before it is served ahead of every non-aged action:
        `aging_relative` times its expected run, at least `aging_min_s`, at most `aging_s` and
        half its own timeout (above `aging_min_s`): ordering never holds an action back until
        its caller gives up (a /run_code answers 504 after its timeouts and a grace)."""
        cfg = self.config
        hi = min(cfg.aging_s, max(cfg.aging_min_s, 0.5 * rec.spec.timeout_s))
        return min(hi, max(cfg.aging_min_s, cfg.aging_relative * rec.est))

    def _enqueue(self: Core, rec: ActionRecord) -> None:
        spec = rec.spec
        shared = not rec.is_model and spec.session is None and rec.partition is None
        key: Any = rec.skey if shared else self._queue_key(rec)
        rec.queue_key = key
        gen = rec.gen = rec.gen + 1
        seq = rec.seq
        cfg = self.config  # _aging_after, inlined (see there)
        x, lo, hi = cfg.aging_relative * rec.est, cfg.aging_min_s, cfg.aging_s
        half = 0.5 * spec.timeout_s
        if half < hi:
            hi = half if half > lo else lo
        x = x if x > lo else lo  # (what the builtins return, without their calls)
        aging_after = x if x < hi else hi
        aged = self.now - rec.submit_time >= aging_after
        if aged:
            entry = (_AGED, seq, gen, spec.id)
            self._aged_pushes += 1
        else:
            entry = (self._fifo_rank(rec), seq, gen, spec.id)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = []
        heapq.heappush(q, entry)
        qlive = self.qlive
        before = qlive.get(key, 0)
        qlive[key] = before + 1
        look = True
        if shared:
            self.shape_keys[key] = rec.cpu
            # With a live action of this shape queued, the last pass left the queue's head
            # blocked: no alive node outside the reservations fits the shape (work
            # conservation). With no capacity freed since (nothing dirty), a non-aged action of
            # the shape is blocked too, head or not: the queue needs no look.
            # (An elastic head may wait by choice, not for room, and its choice depends on
            # how many wait: its queue is always worth a look.)
            look = not before or aged or bool(self.dirty) or (key.elastic and self.elastic)
        elif key[0] == "sess" and rec.partition is not None:
            self.part_sess.setdefault(rec.partition, set()).add(key)
        elif key[0] == "model":
            self.models_touched.add(key[1])
        # Every head is blocked after a pass; an entry that does not become the head cannot
        # change that, so only a new head makes its queue worth a look.
        e0 = q[0]
        if not look:
            pass  # (see above)
        elif e0[1] == seq and e0[2] == gen:  # `e0 is entry`: fresh, so the head (`_head` would
            # return it). (Compared by (seq, gen), which no other entry has: compiled, a tuple
            # of fixed shape is unboxed, and the heap holds a boxed copy, never `entry` itself.)
            self.touched.add(key)
        else:
            r0 = self.actions.get(e0[3])
            if r0 is None or r0.gen != e0[2] or r0.queue_key != key:  # stale head: `_head` pops
                got = self._head(key)
                if got is not None and got[1][1] == seq and got[1][2] == gen:  # (`is entry`)
                    self.touched.add(key)
        if not aged:
            heapq.heappush(self.aging_heap, (rec.submit_time + aging_after, seq, spec.id))
        if rec.elastic and self.elastic:
            heapq.heappush(self._overdue_at, (self._overdue_from(rec), seq, spec.id))

    def _dequeue(self: Core, rec: ActionRecord) -> None:
        key = rec.queue_key
        n = self.qlive.get(key, 0) - 1
        if n <= 0:
            self.qlive.pop(key, None)
            self.shape_keys.pop(key, None)
            self.queues.pop(key, None)
        else:
            self.qlive[key] = n
            if type(key) is not ShapeKey and key[0] != "model":
                # a session or partition queue holds actions of several shapes: the next
                # head may fit where this one did not
                self.touched.add(key)
        rec.queue_key = None
        rec.gen += 1
        if self.reserved:
            for name in [n for n, a in self.reserved.items() if a == rec.spec.id]:
                del self.reserved[name]

    def _head(self: Core, key: Any) -> tuple[ActionRecord, Entry] | None:
        q = self.queues.get(key)
        actions = self.actions
        while q:
            e = q[0]
            rec = actions.get(e[3])
            if rec is not None and rec.gen == e[2] and rec.queue_key == key:
                return rec, e
            heapq.heappop(q)
        return None

    def _age(self: Core) -> None:
        heap, now = self.aging_heap, self.now
        while heap and heap[0][0] <= now:
            _, seq, aid = heapq.heappop(heap)
            rec = self.actions.get(aid)
            if rec is None or rec.seq != seq or rec.status is not _QUEUED:
                continue
            key = rec.queue_key
            rec.gen += 1
            heapq.heappush(self.queues[key], (_AGED, rec.seq, rec.gen, aid))
            self._aged_pushes += 1
            rec.note(now, "aged", "aging")
            self.touched.add(key)
            if key[0] == "model":
                self.models_touched.add(key[1])

    # ---- the pass -------------------------------------------------------------------------------
    def _candidates(self: Core) -> set[Any]:
        keys: set[Any] = set(self.shape_keys)
        touched = self.touched
        if touched:
            keys.update(k for k in touched if k[0] != "model")
        nodes, part_by_node = self.nodes, self.part_by_node
        for name in self.dirty:
            sessions = nodes[name].sessions
            if sessions:
                keys.update(("sess", sid) for sid in sessions)
            if part_by_node:
                keys.update(("part", p) for p in part_by_node.get(name, ()))
        return keys

    def _schedule(self: Core) -> None:
        dirty = self.dirty
        if self._parts_dirty and self.policy.partitioned:
            self._compute_partitions()
        if self.pending_sessions and dirty:
            for sid in list(self.pending_sessions):
                self._open_session(self.sessions[sid])
        # Shared-pool queues that were blocked after the last pass can only fit on nodes whose
        # free capacity grew since (dirty, or released from a reservation): look only there.
        local: list[NodeState] | None = None
        local_cpu = -1.0
        touched = self.touched
        keys: Any
        if dirty:  # capacity changed: every queue may move, reservations are redone
            reserved = self.reserved
            freed = dirty | reserved.keys() if reserved else dirty
            reserved.clear()
            if len(freed) == 1 and not touched and not self.part_by_node:
                for name in freed:
                    node = self.nodes[name]
                if not node.sessions and node.alive:
                    if self.shape_keys:  # the common case: one node, the shared-pool queues
                        self._fill_node(node)
                    return
                keys = self._candidates()
                if not keys:
                    return
                if node.alive:
                    local = [node]
                    local_cpu = node.free.get(CPU, 0.0)
                else:
                    local = []
            else:
                keys = self._candidates()
                if not keys:
                    return
                if len(freed) <= 32:
                    nodes = self.nodes
                    local = [n for n in (nodes[x] for x in (sorted(freed) if len(freed) > 1 else freed))
                             if n.alive]
                    for n in local:
                        c = n.free.get(CPU, 0.0)
                        if c > local_cpu:
                            local_cpu = c
        elif touched:  # only arrivals: queues blocked before stay blocked
            if len(touched) == 1:
                for key in touched:
                    if key[0] != "model":
                        self._drain_one(key)
                return
            keys = {k for k in touched if k[0] != "model"}
        else:
            return
        self._pass(keys, local, local_cpu)

    def _pass(self: Core, keys: Any, local: list[NodeState] | None, local_cpu: float) -> None:
        """Place queue heads of ``keys`` in priority order until every one is blocked; with
        ``local`` (the nodes whose capacity grew, ``local_cpu`` the most CPU free on one),
        shared-pool heads not touched by this event are only tried there."""
        touched = self.touched
        head = self._head
        heap: list[tuple[int, int, Any, ActionRecord]] = []  # (rank, seq, key, head)
        limit = local_cpu + 1e-9
        for key in keys:
            got = head(key)
            if got is None:
                continue
            e = got[1]
            if (e[0] != _AGED and local is not None and type(key) is ShapeKey and got[0].cpu > limit
                    and key not in touched):
                continue  # more CPU than any freed node has: still blocked (aged heads go on)
            heap.append((e[0], e[1], key, got[0]))
        if len(heap) > 1:
            heapq.heapify(heap)
        while heap:  # entries stay fresh: only the popped queue's head changes in the loop
            aged, _, key, rec = heapq.heappop(heap)
            if local is not None and type(key) is ShapeKey and key not in touched:
                # cheap first test: more CPU than any freed node has cannot fit
                if rec.elastic and self.elastic:  # (its width decides where: elastic.py)
                    placed = rec.cpu <= limit and self._place_elastic(rec)
                else:
                    placed = rec.cpu <= limit and self._place_among(rec, local)
                if placed:  # the freed nodes have less now: keep the cheap test exact
                    local_cpu = -1.0
                    for n in local:
                        c = n.free.get(CPU, 0.0)
                        if c > local_cpu:
                            local_cpu = c
                    limit = local_cpu + 1e-9
            else:
                placed = self._try_place(rec, key)
            if placed:
                got = head(key)
                if got is not None:
                    e = got[1]
                    heapq.heappush(heap, (e[0], e[1], key, got[0]))
            elif aged == _AGED:
                self._reserve_for(rec, key)

    def _fill_node(self: Core, node: NodeState) -> None:
        """`_schedule`'s pass when one alive node without sessions freed capacity and no queue
        was touched: the candidates are the shared-pool queues' heads, the only node to try is
        that one (the loop below is `_schedule`'s, with what that case makes constant folded).
        """
        head = self._head
        free = node.free
        limit = free.get(CPU, 0.0) + 1e-9
        heap: list[tuple[int, int, Any, ActionRecord]] = []  # (rank, seq, key, head)
        no_aged = not self._aged_pushes
        for key, kcpu in self.shape_keys.items():  # (no placement happens before this loop ends)
            if no_aged and kcpu > limit:
                continue  # (below, for a head that cannot be aged: all its queue has that cpu)
            got = head(key)
            if got is None:
                continue
            rec, e = got
            if e[0] != _AGED and rec.cpu > limit:
                continue  # more CPU than the node has: still blocked (aged heads go on)
            heap.append((e[0], e[1], key, rec))
        if len(heap) > 1:
            heapq.heapify(heap)
        name, reserved = node.name, self.reserved
        while heap:
            aged, _, key, rec = heapq.heappop(heap)
            placed = False
            if rec.elastic and self.elastic:  # (its width decides where: elastic.py)
                placed = rec.cpu <= limit and self._place_elastic(rec)
                limit = free.get(CPU, 0.0) + 1e-9
            elif rec.cpu <= limit and name not in reserved:  # `_place_among(rec, [node])`
                for k, v in rec.shape:
                    if v > free.get(k, 0.0) + 1e-9:
                        break
                else:
                    self._start(rec, node, rec.spec.demand,
                                self._take_warm(node, rec.wkey) if node.warm else False)
                    placed = True
                    limit = free.get(CPU, 0.0) + 1e-9
            if placed:
                if no_aged and rec.cpu > limit:
                    continue  # its queue's next head has its cpu (the shape's): cannot fit now
                got = head(key)
                if got is not None:
                    e = got[1]
                    heapq.heappush(heap, (e[0], e[1], key, got[0]))
            elif aged == _AGED:
                self._reserve(rec)

    def _drain_one(self: Core, key: Any) -> None:
        """`_schedule`'s loop when only one queue is a candidate (no freed nodes): place its
        heads until one is blocked; a blocked, aged shared-pool head reserves a node."""
        head = self._head
        got = head(key)
        while got is not None:
            rec = got[0]
            if not self._try_place(rec, key):
                if got[1][0] == _AGED:
                    self._reserve_for(rec, key)
                return
            got = head(key)
