# mypy: disable-error-code="misc"
"""The scheduling pass: queues, ordering, aging, placement, partitions, elastic expansion.

Invariant: after `_schedule` returns, every queue's head is blocked -- no queued action of the
shared pool fits any alive node that is not reserved for an aged action (work conservation),
and a partition or session queue's head does not fit where it may go.

Queues are heaps of ``(aged, priority, seq, gen, id)``; ``aged`` is 0 once an action has waited
``_aging_after`` (aged entries come first, oldest first). Entries go stale lazily (``gen``). Actions
of the shared pool are queued per *demand shape*, so one pass costs O(shapes + placements),
never O(pending): a blocked head blocks its whole shape.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import TYPE_CHECKING, Any

from .actions import Status
from .build import make_start
from .fit import _best_warm2, _scan_index2
from .nodeindex import RES, FreeIndex
from .records import ActionRecord, NodeState, SessionRecord
from .resources import CPU, Resources

if TYPE_CHECKING:
    from .core import Core

S = Status
_QUEUED, _STARTING = S.QUEUED, S.STARTING  # (module constants: cheaper than S.QUEUED)
_QUEUED_V, _STARTING_V = int(S.QUEUED), int(S.STARTING)
Entry = tuple[int, float, int, int, str]
_SQRT_HALF = math.sqrt(0.5)


class SchedulingMixin:
    """Part of `Core`: everything between a queued action and a StartAction."""

    def _init_scheduling(self: Core) -> None:
        self.queues: dict[Any, list[Entry]] = {}
        self.qlive: dict[Any, int] = {}
        self.shape_keys: dict[Any, None] = {}  # shared-pool queues with live entries
        self.aging_heap: list[tuple[float, int, str]] = []
        self._aged_pushes = 0  # aged queue entries ever pushed (0: every live head is non-aged)
        self.reserved: dict[str, str] = {}  # node -> aged action it is held for
        self._ref_cap: dict[str, float] | None = None
        self._possible: dict[Any, bool] = {}
        self._shares: dict[Any, float] = {}  # demand shape -> dominant share of `_ref()`
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
        self.rates: dict[str, float] = {}
        self.last_rate_time: float | None = None
        self.warm_sent: dict[tuple[str, str], int] = {}
        self._warm_names: list[str] | None = None  # CPU nodes warm pools spread over
        self._warm_want: dict[str, int] = {}  # key -> warm executors last spread over them
        self._grow: set[str] = set()  # nodes where elastic expansion may look

    # ---- queues ---------------------------------------------------------------------------------
    def _queue_key(self: Core, rec: ActionRecord) -> Any:
        spec = rec.spec
        if rec.is_model:
            return ("model", spec.model)
        if spec.session is not None:
            return ("sess", spec.session)
        if rec.partition is not None:
            return ("part", rec.partition)
        return rec.skey  # ("shape", rec.shape, rec.cpu)

    def _priority(self: Core, rec: ActionRecord) -> float:
        """Expected work x resources held / weight, in half-octave classes (FIFO inside one).

        The classes keep actions of one kind in arrival order while their estimates drift a
        little as the estimator learns; only a real difference in size (>= ~1.4x) reorders.
        """
        if not self.policy.ordered:
            return float(rec.seq)
        if rec.is_model:
            share = 0.0
        else:
            share = self._shares.get(rec.shape)  # type: ignore[assignment]
            if share is None:
                share = self._shares[rec.shape] = rec.spec.demand.dominant_share(self._ref())
        x = rec.est * (1e-3 if share < 1e-3 else share) / rec.spec.weight  # max(share, 1e-3)
        if x <= 0.0:
            return -math.inf
        m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
        return float(2 * e + (m >= _SQRT_HALF))

    def _aging_after(self: Core, rec: ActionRecord) -> float:
        """How long ``rec`` may wait before it is served ahead of every non-aged action."""
        cfg = self.config
        return min(cfg.aging_s, max(cfg.aging_min_s, cfg.aging_relative * rec.est))

    def _enqueue(self: Core, rec: ActionRecord) -> None:
        spec = rec.spec
        shared = not rec.is_model and spec.session is None and rec.partition is None
        key: Any = rec.skey if shared else self._queue_key(rec)
        rec.queue_key = key
        gen = rec.gen = rec.gen + 1
        seq = rec.seq
        cfg = self.config  # _aging_after, inlined: min(aging_s, max(aging_min_s, relative * est))
        x, lo, hi = cfg.aging_relative * rec.est, cfg.aging_min_s, cfg.aging_s
        x = x if x > lo else lo  # (what the builtins return, without their calls)
        aging_after = x if x < hi else hi
        aged = self.now - rec.submit_time >= aging_after
        if aged:
            entry = (0, float(seq), seq, gen, spec.id)
            self._aged_pushes += 1
        else:
            entry = (1, self._priority(rec), seq, gen, spec.id)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = []
        heapq.heappush(q, entry)
        qlive = self.qlive
        qlive[key] = qlive.get(key, 0) + 1
        if shared:
            self.shape_keys[key] = None
        elif key[0] == "sess" and rec.partition is not None:
            self.part_sess.setdefault(rec.partition, set()).add(key)
        elif key[0] == "model":
            self._mtouched.add(key[1])
        # Every head is blocked after a pass; an entry that does not become the head cannot
        # change that, so only a new head makes its queue worth a look.
        e0 = q[0]
        if e0 is entry:  # fresh, so the head (`_head` would return it)
            self._touched.add(key)
        else:
            r0 = self.actions.get(e0[4])
            if r0 is None or r0.gen != e0[3] or r0.queue_key != key:  # stale head: `_head` pops
                got = self._head(key)
                if got is not None and got[1] is entry:
                    self._touched.add(key)
        if not aged:
            heapq.heappush(self.aging_heap, (rec.submit_time + aging_after, seq, spec.id))

    def _dequeue(self: Core, rec: ActionRecord) -> None:
        key = rec.queue_key
        n = self.qlive.get(key, 0) - 1
        if n <= 0:
            self.qlive.pop(key, None)
            self.shape_keys.pop(key, None)
            self.queues.pop(key, None)
        else:
            self.qlive[key] = n
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
            rec = actions.get(e[4])
            if rec is not None and rec.gen == e[3] and rec.queue_key == key:
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
            heapq.heappush(self.queues[key], (0, float(rec.seq), rec.seq, rec.gen, aid))
            self._aged_pushes += 1
            rec.note(now, "aged", "aging")
            self._touched.add(key)
            if key[0] == "model":
                self._mtouched.add(key[1])

    # ---- the pass -------------------------------------------------------------------------------
    def _candidates(self: Core) -> set[Any]:
        keys: set[Any] = set(self.shape_keys)
        touched = self._touched
        if touched:
            keys.update(k for k in touched if k[0] != "model")
        nodes, part_by_node = self.nodes, self.part_by_node
        for name in self._dirty:
            sessions = nodes[name].sessions
            if sessions:
                keys.update(("sess", sid) for sid in sessions)
            if part_by_node:
                keys.update(("part", p) for p in part_by_node.get(name, ()))
        return keys

    def _schedule(self: Core) -> None:
        dirty = self._dirty
        if self._parts_dirty and self.policy.partitioned:
            self._compute_partitions()
        if self.pending_sessions and dirty:
            for sid in list(self.pending_sessions):
                self._open_session(self.sessions[sid])
        # Shared-pool queues that were blocked after the last pass can only fit on nodes whose
        # free capacity grew since (dirty, or released from a reservation): look only there.
        local: list[NodeState] | None = None
        local_cpu = -1.0
        touched = self._touched
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
        touched = self._touched
        head = self._head
        heap: list[tuple[int, float, int, Any, ActionRecord]] = []
        limit = local_cpu + 1e-9
        for key in keys:
            got = head(key)
            if got is None:
                continue
            e = got[1]
            if (e[0] and local is not None and key[0] == "shape" and got[0].cpu > limit
                    and key not in touched):
                continue  # more CPU than any freed node has: still blocked (aged heads go on)
            heap.append((e[0], e[1], e[2], key, got[0]))
        if len(heap) > 1:
            heapq.heapify(heap)
        while heap:  # entries stay fresh: only the popped queue's head changes in the loop
            aged, _, _, key, rec = heapq.heappop(heap)
            if local is not None and key[0] == "shape" and key not in touched:
                # cheap first test: more CPU than any freed node has cannot fit
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
                    heapq.heappush(heap, (e[0], e[1], e[2], key, got[0]))
            elif aged == 0 and key[0] == "shape":
                self._reserve(rec)

    def _fill_node(self: Core, node: NodeState) -> None:
        """`_schedule`'s pass when one alive node without sessions freed capacity and no queue
        was touched: the candidates are the shared-pool queues' heads, the only node to try is
        that one (the loop below is `_schedule`'s, with what that case makes constant folded).
        """
        head = self._head
        free = node.free
        limit = free.get(CPU, 0.0) + 1e-9
        heap: list[tuple[int, float, int, Any, ActionRecord]] = []
        no_aged = not self._aged_pushes
        for key in self.shape_keys:  # (no placement happens before this loop ends)
            if no_aged and key[2] > limit:
                continue  # (below, for a head that cannot be aged: all its queue has that cpu)
            got = head(key)
            if got is None:
                continue
            rec, e = got
            if e[0] and rec.cpu > limit:
                continue  # more CPU than the node has: still blocked (aged heads go on)
            heap.append((e[0], e[1], e[2], key, rec))
        if len(heap) > 1:
            heapq.heapify(heap)
        name, reserved = node.name, self.reserved
        while heap:
            aged, _, _, key, rec = heapq.heappop(heap)
            placed = False
            if rec.cpu <= limit and name not in reserved:  # `_place_among(rec, [node])`
                for k, v in rec.shape:
                    if v > free.get(k, 0.0) + 1e-9:
                        break
                else:
                    self._start(rec, node, rec.spec.demand, self._take_warm(node, rec.wkey))
                    placed = True
                    limit = free.get(CPU, 0.0) + 1e-9
            if placed:
                got = head(key)
                if got is not None:
                    e = got[1]
                    heapq.heappush(heap, (e[0], e[1], e[2], key, got[0]))
            elif aged == 0:
                self._reserve(rec)

    def _drain_one(self: Core, key: Any) -> None:
        """`_schedule`'s loop when only one queue is a candidate (no freed nodes): place its
        heads until one is blocked; a blocked, aged shared-pool head reserves a node."""
        head = self._head
        got = head(key)
        while got is not None:
            rec = got[0]
            if not self._try_place(rec, key):
                if got[1][0] == 0 and key[0] == "shape":
                    self._reserve(rec)
                return
            got = head(key)

    def _try_place(self: Core, rec: ActionRecord, key: Any) -> bool:
        kind = key[0]
        spec = rec.spec
        if kind == "shape":
            node = self._find_node(rec)
            if node is None:
                return False
            self._start(rec, node, spec.demand, self._take_warm(node, rec.wkey))
            return True
        if kind == "part":
            return self._place_in_partition(rec, None)
        sess = self.sessions.get(key[1])
        if sess is None or sess.node is None:
            return False
        if rec.partition is not None and (rec.partition, sess.node) in self.part_quota:
            return self._place_in_partition(rec, sess.node)
        node = self.nodes[sess.node]
        alloc = spec.demand
        if rec.partition is not None:  # its slice moved away: the node is its slice, CPU capped
            cpu = min(spec.demand.get(CPU, 0.0), node.cap.get(CPU, 0.0))
            alloc = alloc.with_amount(CPU, cpu)
        if not node.fits(alloc):
            return False
        self._start(rec, node, alloc, True)
        return True

    def _place_among(self: Core, rec: ActionRecord, nodes: list[NodeState]) -> bool:
        """Best fit of a shared-pool action among a few given nodes (warm first)."""
        shape = rec.shape
        wkey = rec.wkey if self.warm_nodes else ""
        reserved = self.reserved
        best: NodeState | None = None
        best_w, best_left = 2, math.inf
        for node in nodes:
            if node.name in reserved:
                continue
            free, cap = node.free, node.cap
            left = 0.0  # _fit_leftover, inlined: this runs on every freed node
            for k, v in shape:
                f = free.get(k, 0.0)
                if v > f + 1e-9:
                    left = -1.0
                    break
                c = cap.get(k, 0.0)
                if c > 0:
                    x = (f - v) / c
                    if x > left:
                        left = x
            if left < 0.0:
                continue
            w = 0 if node.warm.get(wkey) else 1
            if w < best_w or (w == best_w and left < best_left):
                best, best_w, best_left = node, w, left
        if best is None:
            return False
        self._start(rec, best, rec.spec.demand, self._take_warm(best, rec.wkey))
        return True

    def _start(self: Core, rec: ActionRecord, node: NodeState, alloc: Resources, warm: bool) -> None:
        key = rec.queue_key  # `_dequeue(rec)`, inlined
        qlive = self.qlive
        n = qlive.get(key, 0) - 1
        if n <= 0:
            qlive.pop(key, None)
            self.shape_keys.pop(key, None)
            self.queues.pop(key, None)
        else:
            qlive[key] = n
        rec.queue_key = None
        rec.gen += 1
        if self.reserved:
            for name in [n for n, a in self.reserved.items() if a == rec.spec.id]:
                del self.reserved[name]
        node.take(alloc)
        spec = rec.spec
        aid = spec.id
        node.running.add(aid)
        self.index.update(node.name, node.free)
        rec.node = node.name
        rec.allotment = alloc
        rec.start_time = now = self.now
        rec.attempts += 1
        cause = self._cause
        if rec.status is not _QUEUED:  # `rec.move(_STARTING, now, cause)`: QUEUED -> STARTING
            rec.move(_STARTING, now, cause)
        else:
            rec.story += (now, _QUEUED_V, _STARTING_V, cause)  # (statuses as ints: `move`)
            rec.status = _STARTING
        out = self._out
        self._starts[aid] = len(out)
        out.append(make_start(spec, node.name, alloc, warm, cause))  # StartAction(...)
        el = spec.elasticity
        if el is not None and el.max > el.min:  # elastic (Elasticity.is_elastic)
            self._grow.add(node.name)

    def _find_node(self: Core, rec: ActionRecord) -> NodeState | None:
        """Best fit (least leftover dominant share) among the first few nodes that fit,
        preferring a node with a warm executor for the action's key."""
        nodes, reserved = self.nodes, self.reserved
        shape = rec.shape
        wkey = rec.wkey if self.warm_nodes else ""
        ws = self.warm_nodes.get(wkey)
        best: NodeState | None = None
        best_w, best_left = 2, math.inf
        if ws and len(ws) <= 64 and len(shape) == 2:
            best = _best_warm2(ws, nodes, reserved, shape)
            if best is not None:
                return best
            ws = None  # (nothing warm fits: fall through to the index)
        if ws and len(ws) <= 64:
            for name in ws:  # _fit_leftover, inlined: up to 64 nodes per placement
                node = nodes[name]
                if not node.alive or name in reserved:
                    continue
                free, cap = node.free, node.cap
                left = 0.0
                for k, v in shape:
                    f = free.get(k, 0.0)
                    if v > f + 1e-9:
                        break
                    c = cap.get(k, 0.0)
                    if c > 0:
                        x = (f - v) / c
                        if x > left:
                            left = x
                else:
                    if left < best_left:
                        best, best_left = node, left
            if best is not None:
                return best
        index = self.index
        levels = index.levels
        cpu = rec.cpu
        lvl = int(cpu * RES + 1e-9) if cpu > 0 else 0  # nodeindex.level
        if not levels or lvl > levels[-1]:
            return None  # no node has that much free CPU
        found, enough = 0, self.config.fit_candidates
        buckets = index._buckets
        if len(shape) == 2 and not (ws and len(ws) > 64):
            # No warm node can win here (none is warm for the key, or none of at most 64 fits:
            # see above), so every candidate has w == 1: the same scan, unrolled.
            return _scan_index2(levels[bisect.bisect_left(levels, lvl):], buckets, nodes,
                                reserved, shape, enough)
        for lv in levels[bisect.bisect_left(levels, lvl):]:
            for name in buckets[lv]:
                if name in reserved:
                    continue
                node = nodes[name]
                free, cap = node.free, node.cap
                left = 0.0  # _fit_leftover(node, shape), inlined
                for k, v in shape:
                    f = free.get(k, 0.0)
                    if v > f + 1e-9:
                        left = -1.0
                        break
                    c = cap.get(k, 0.0)
                    if c > 0:
                        x = (f - v) / c
                        if x > left:
                            left = x
                if left < 0.0:
                    continue
                w = 0 if node.warm.get(wkey) else 1
                if w < best_w or (w == best_w and left < best_left):
                    best, best_w, best_left = node, w, left
                found += 1
                if found >= enough:
                    return best
        return best

    def _reserve(self: Core, rec: ActionRecord) -> None:
        """Hold the node closest to fitting an aged, blocked action for it alone."""
        demand = rec.spec.demand
        for lvl in reversed(self.index.levels):
            for name in self.index._buckets[lvl]:
                node = self.nodes[name]
                if name not in self.reserved and demand.fits_in(node.cap):
                    self.reserved[name] = rec.spec.id
                    return

    def _take_warm(self: Core, node: NodeState, key: str) -> bool:
        n = node.warm.get(key, 0) if node.warm else 0
        if n > 0:
            self._set_warm(node, key, n - 1)
            return True
        return False

    def _set_warm(self: Core, node: NodeState, key: str, n: int) -> None:
        node.warm[key] = n
        s = self.warm_nodes.setdefault(key, {})
        if n > 0:
            s[node.name] = None
        else:
            s.pop(node.name, None)

    def _session_node(self: Core, sess: SessionRecord, hint: Any) -> NodeState | None:
        """Where a session opens: its trajectory's slice, else the node with most free CPU."""
        rec = hint if isinstance(hint, ActionRecord) else None
        if rec is None:  # a pending session: open it where its waiting actions can run
            recs = [self.actions[a] for a in sorted(sess.actions) if a in self.actions]
            rec = max(recs, key=lambda r: (r.spec.demand.get("memory_mb"), r.seq), default=None)
        if rec is not None and rec.partition is not None:
            if self._parts_dirty:
                self._compute_partitions()
            for name, _ in self.partitions.get(rec.partition, ()):
                node = self.nodes[name]
                if node.alive and node.fits(sess.demand + rec.spec.demand.with_amount(CPU, 0)):
                    return node
        need = sess.demand + (rec.spec.demand if rec is not None else Resources())
        for lvl in reversed(self.index.levels):
            for name in self.index._buckets[lvl]:
                node = self.nodes[name]
                if name not in self.reserved and node.fits(need):
                    return node
        if rec is None:
            return None  # an explicit session with no actions yet waits for room
        # busy everywhere: open it where the action can run once capacity frees up
        fits = [n for n in self.nodes.values() if n.alive and need.fits_in(n.cap) and n.fits(sess.demand)]
        return max(fits, key=lambda n: (n.free.get(CPU, 0.0), n.name), default=None)

    # ---- capacity facts -------------------------------------------------------------------------
    def _node_changed(self: Core) -> None:
        self._possible.clear()
        self._shares.clear()
        self._warm_names = None
        self._warm_want.clear()
        self._ref_cap = None
        self._parts_dirty = True

    def _ref(self: Core) -> dict[str, float]:
        if self._ref_cap is None:
            self._ref_cap = self._largest()
        return self._ref_cap

    def _largest(self: Core) -> dict[str, float]:
        ref: dict[str, float] = {}
        for n in self.nodes.values():
            if n.alive:
                for k, v in n.cap.items():
                    if v > ref.get(k, 0.0):
                        ref[k] = v
        return ref

    def _fits_some_node(self: Core, demand: Resources, key: tuple) -> bool:
        ok = self._possible.get(key)
        if ok is None:
            ok = any(n.alive and demand.fits_in(n.cap) for n in self.nodes.values())
            self._possible[key] = ok
        return ok
