# mypy: disable-error-code="misc"
"""Placement: which node an action of a queue head goes to, and starting it there.

Invariant: an action is started (`_start`) only on an alive node where its allotment fits the
free capacity (no dimension short by more than 1e-9), never on a node reserved for another
(aged) action; among the candidates it takes the best fit (least leftover dominant share),
preferring a node with a warm executor for its key. `_start` is the only way from QUEUED to
STARTING: it takes the allotment, updates the free index and emits the StartAction.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

from .actions import Status
from .build import make_start
from .fit import _best_warm2, _fit_leftover, _fits_besides_cpu, _scan_index2
from .nodeindex import RES
from .records import ActionRecord, NodeState, SessionRecord, ShapeKey
from .resources import CPU, Resources

if TYPE_CHECKING:
    from .core import Core

_QUEUED, _STARTING = Status.QUEUED, Status.STARTING  # (module constants: cheaper than S.QUEUED)
_QUEUED_V, _STARTING_V = int(Status.QUEUED), int(Status.STARTING)
# Most warm nodes `_find_node` looks at per placement before it falls back to the index (which
# still prefers a warm node among its candidates): bounded work when many warm nodes are full.
_WARM_SCAN = 64


@trait  # (a part of `Core`: mypyc compiles it into that class; see `_native.py`)
class PlacementMixin:
    """Part of `Core`: from a queue head to a StartAction on a node; node capacity facts."""


    def _try_place(self: Core, rec: ActionRecord, key: Any) -> bool:
        spec = rec.spec
        if type(key) is ShapeKey:
            if rec.elastic and self.elastic:
                return self._place_elastic(rec)  # (elastic.py: its width, then its node)
            node = self._find_node(rec)
            if node is None and (not self.elastic or (node := self._lender(rec)) is None):
                return False
            self._start(rec, node, spec.demand, self._take_warm(node, rec.wkey) if node.warm else False)
            return True
        if key[0] == "part":
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
        elif rec.elastic and self.elastic:  # its width on its session's node (elastic.py)
            if not _fits_besides_cpu(node, rec.shape):
                return False
            width, floor = self._elastic_start(rec, node, 0)
            if width <= 0.0:
                if node.free.get(CPU, 0.0) > 1e-9:
                    self.expand_at.add(node.name)  # its elastic actions go wide while it waits
                return False
            self._start_elastic(rec, node, width, floor)
            return True
        if not node.fits(alloc) and not (self.elastic and self._reclaim(node, alloc)):
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
            left = _fit_leftover(node, shape)
            if left < 0.0:
                continue
            w = 0 if node.warm.get(wkey) else 1
            if w < best_w or (w == best_w and left < best_left):
                best, best_w, best_left = node, w, left
        if best is None:
            return False
        self._start(rec, best, rec.spec.demand, self._take_warm(best, rec.wkey) if best.warm else False)
        return True

    def _start(self: Core, rec: ActionRecord, node: NodeState, alloc: Resources, warm: bool) -> None:
        if self.resident and rec.spec.session is None:
            warm = True  # static stacks keep their sandboxes resident (policies.py)
        quota = alloc  # what the StartAction carries: the executor's limit
        if rec.charge is not None:
            alloc = rec.charge  # admitted by its measured use: the node is charged that
        self.queues.started(rec)
        used, free, cap = node.used, node.free, node.cap  # `node.take(alloc)`, inlined
        for k, v in (alloc._d if type(alloc) is Resources else alloc).items():
            u = used.get(k, 0.0) + v
            used[k] = u
            free[k] = cap.get(k, 0.0) - u
        spec = rec.spec
        aid = spec.id
        node.running.add(aid)
        self.index.update(node.name, node.free)
        rec.node = node.name
        rec.allotment = alloc
        rec.start_time = now = self.now
        rec.attempts += 1
        cause = self.cause
        if rec.status is not _QUEUED:  # `rec.move(_STARTING, now, cause)`: QUEUED -> STARTING
            rec.move(_STARTING, now, cause)
        else:
            rec.story += (now, _QUEUED_V, _STARTING_V, cause)  # (statuses as ints: `move`)
            rec.status = _STARTING
        out = self.out
        self.start_index[aid] = len(out)
        out.append(make_start(spec, node.name, quota, warm, cause))  # StartAction(...)
        rec.done = 0.0  # (its work done so far: `_remaining`)
        rec.since = now
        if rec.elastic:
            self.expand_at.add(node.name)
            self.elastic_nodes.add(node.name)  # (elastic.py: where expansion can look)

    def _find_node(self: Core, rec: ActionRecord) -> NodeState | None:
        """Best fit (least leftover dominant share) among the first few nodes that fit,
        preferring a node with a warm executor for the action's key."""
        nodes, reserved = self.nodes, self.reserved
        shape = rec.shape
        wkey = rec.wkey if self.warm_nodes else ""
        ws = self.warm_nodes.get(wkey)
        best: NodeState | None = None
        best_w, best_left = 2, math.inf
        enough = self.config.fit_candidates
        # Warm nodes first, however many there are (a large cluster keeps a floor of warm
        # sandboxes on every node), looking at no more than `_WARM_SCAN` of them per placement.
        if ws and len(shape) == 2:
            best = _best_warm2(ws, nodes, reserved, shape, enough, _WARM_SCAN)
            if best is not None:
                return best
            ws = None  # (none of them fits: fall through to the index)
        if ws:
            found = seen = 0
            for name in ws:
                seen += 1
                if seen > _WARM_SCAN:
                    break
                node = nodes[name]
                if not node.alive or name in reserved:
                    continue
                left = _fit_leftover(node, shape)
                if left < 0.0:
                    continue
                if left < best_left:
                    best, best_left = node, left
                found += 1
                if found >= enough:
                    return best
            if best is not None:
                return best
        index = self.index
        if index._held is not None:
            index.flush()
        levels = index.levels
        cpu = rec.cpu
        lvl = int(cpu * RES + 1e-9) if cpu > 0 else 0  # nodeindex.level
        if not levels or lvl > levels[-1]:
            return None  # no node has that much free CPU
        found = 0
        buckets = index._buckets
        if len(shape) == 2:
            # No warm node can win here (none is warm for the key, or none of those looked at
            # fits: see above), so every candidate has w == 1: the same scan, unrolled.
            return _scan_index2(levels[bisect.bisect_left(levels, lvl):], buckets, nodes,
                                reserved, shape, enough)
        for lv in levels[bisect.bisect_left(levels, lvl):]:
            for name in buckets[lv]:
                if name in reserved:
                    continue
                node = nodes[name]
                left = _fit_leftover(node, shape)
                if left < 0.0:
                    continue
                w = 0 if node.warm.get(wkey) else 1
                if w < best_w or (w == best_w and left < best_left):
                    best, best_w, best_left = node, w, left
                found += 1
                if found >= enough:
                    return best
        return best

    def _lender(self: Core, rec: ActionRecord) -> NodeState | None:
        """No node fits a shared-pool head: the node whose grown elastic actions can lend it
        the CPU it lacks (the one with the most lent out), after they lent it; else None."""
        best: NodeState | None = None
        most = 1e-9  # (a node that lends nothing cannot help)
        need = rec.charge if rec.charge is not None else rec.spec.demand
        for name in self.elastic_nodes:
            node = self.nodes[name]
            if not node.alive or name in self.reserved:
                continue
            lent = 0.0
            for aid in node.running:
                other = self.actions.get(aid)
                el = other.spec.elasticity if other is not None else None
                if other is not None and el is not None and el.dim == CPU and other.allotment is not None:
                    lent += other.allotment.get(CPU) - el.min
            if lent + node.free.get(CPU, 0.0) < rec.cpu - 1e-9 or lent < most - 1e-12:
                continue
            if lent > most + 1e-12 or best is None or name < best.name:  # (ties: by name, as
                best, most = node, lent  # a set's order differs from process to process)
        if best is None or not self._reclaim(best, need):
            return None
        return best

    def _reserve_for(self: Core, rec: ActionRecord, key: Any) -> None:
        """An aged head is blocked: hold a node for it alone -- for a shared-pool action the
        node closest to fitting it, for a session action its session's node (so that new
        work and elastic growth stop taking what it waits for)."""
        if type(key) is ShapeKey:
            self._reserve(rec)
        elif key[0] == "sess":
            sess = self.sessions.get(key[1])
            if sess is not None and sess.node is not None and sess.node not in self.reserved:
                self.reserved[sess.node] = rec.spec.id

    def _reserve(self: Core, rec: ActionRecord) -> None:
        """Hold the node closest to fitting an aged, blocked action for it alone."""
        demand = rec.spec.demand
        self.index.flush()
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
            if self._warm_waiters:  # heads that wait for a warm node look again
                self._rewake.update(self._warm_waiters)
                self._warm_waiters.clear()

    def _session_node(self: Core, sess: SessionRecord, hint: Any) -> NodeState | None:
        """Where a session opens: only where it and one of its actions can always run (the
        sessions already there, this one and the room for an action within capacity) and it
        fits now; inside its trajectory's slice or task's pool for partitioned policies; else
        spread: fewest sessions per core, then most free CPU. Among the candidates with room,
        nodes warm for the session's `warm_key` (an image they hold) come first; without one
        the spread decides and the session pays the cold cost there. None: it waits for room."""
        rec = hint if isinstance(hint, ActionRecord) else None
        if rec is None:  # a pending session: open it where its waiting actions can run
            recs = [self.actions[a] for a in sorted(sess.actions) if a in self.actions]
            rec = max(recs, key=_memory_then_seq, default=None)
        act = self._sess_act if rec is None else rec.spec.demand
        part = rec.partition if rec is not None else self._session_partition(sess)
        if part is not None:
            if self._parts_dirty:
                self._compute_partitions()
            # a trajectory's slice: its largest piece; a task's pool: spread over its pieces
            got = self._spread_session([self.nodes[n] for n, _ in self.partitions.get(part, ())],
                                       sess.demand, act, self.policy.whole_slice, sess.warm_key)
            if got is not None:
                return got
        return self._spread_session(list(self.nodes.values()), sess.demand, act, False,
                                    sess.warm_key)

    def _spread_session(self: Core, nodes: list[NodeState], demand: Resources, act: Resources,
                        largest: bool, warm_key: str | None = None) -> NodeState | None:
        """Of ``nodes`` with room for the session, one warm for ``warm_key`` first (if any
        is); then (with ``largest``) the first in order, else the one that holds the fewest
        sessions per core, then has the most free CPU, then the first name."""
        best: NodeState | None = None
        best_key = (math.inf, math.inf, 0.0, "")
        for node in nodes:
            if not node.alive:
                continue
            if not self._session_room(node, demand, act):
                continue
            cold = 1.0
            if warm_key is not None and node.warm.get(warm_key, 0) > 0:
                cold = 0.0
            if largest:
                if cold == 0.0 or warm_key is None:
                    return node
                if best is None:
                    best = node
                continue
            key = (cold, (len(node.sessions) + 1) / max(node.cap.get(CPU, 0.0), 1e-9),
                   -node.free.get(CPU, 0.0), node.name)
            if key < best_key:
                best, best_key = node, key
        return best

    def _session_room(self: Core, node: NodeState, demand: Resources, act: Resources) -> bool:
        """Whether a session of ``demand`` fits ``node`` now and, with the node's other
        sessions, still leaves room for an action ``act`` of any of them, for good."""
        if not node.fits(demand):
            return False
        held = demand + act
        for sid in node.sessions:
            other = self.sessions.get(sid)
            if other is not None:
                held = held + other.demand
        return held.fits_in(node.cap)


# (sort keys as module functions, not lambdas: mypyc 2.4 crashes on a lambda that closes over
# a local of a method of `Core`'s parts)
def _memory_then_seq(r: ActionRecord) -> tuple[float, int]:
    return (r.spec.demand.get("memory_mb"), r.seq)


def _free_cpu_then_name(n: NodeState) -> tuple[float, str]:
    return (n.free.get(CPU, 0.0), n.name)
