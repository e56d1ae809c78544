"""Sessions: where each opens, the room kept for its actions, and when an idle one expires.

Invariant: an open session holds its demand on its node (`NodeState.sessions`, `used`) until it
is closed; a session waiting for room is in `pending` (with its place in the wait) and holds
nothing, and, where no policy partitions the cluster, in one group of its shape (`_groups`); it
opens only on a node where it, the other sessions there and one action of any of them
(`action_room`, the largest a session's action has needed) fit the capacity for good (`room`).
`expiry` holds one entry per open session: when it may expire, looked at again while it has
live actions. `ranks` (built at the first session placed over the whole cluster) keeps the alive
nodes in `spread`'s order (sessions per core, then most free CPU), so a session's node is found
without a scan of every node.
"""

from __future__ import annotations

import heapq
import math

from .commands import CloseSession, EvictSession, OpenSession
from .events import SessionRequested
from .nodeindex import SpreadIndex
from .partitioning import Partitions
from .records import ActionRecord, NodeState, SessionRecord, session_key
from .resources import CPU, MEMORY_MB, Resources
from .state import CoreState

# a waiting session's shape (`Sessions._shape`): its demand, its largest waiting action's demand
# (or `action_room`), its warm key
Shape = tuple[Resources, Resources, "str | None"]


class Sessions:
    """Open sessions' places on nodes, the ones waiting for room, and their TTLs."""

    def __init__(self, st: CoreState, partitions: Partitions) -> None:
        self.st = st
        self.partitions = partitions
        self.pending: dict[str, int] = {}  # sessions waiting for room -> their place in the wait
        self._place = 0  # places given so far
        # Where no policy partitions the cluster: the waiting sessions by shape (`_shape`),
        # each group a heap of (place, version, id), so a pass tries the first of each shape
        # in the order of the wait instead of walking every waiting session (issue 24); an
        # entry is live while `_entry` holds its shape and version (stale ones are dropped as
        # they surface, and the heap is rebuilt once they outnumber the live ones).
        self._groups: dict[Shape, list[tuple[int, int, str]]] = {}
        self._live: dict[Shape, int] = {}  # shape -> live entries in its heap
        self._entry: dict[str, tuple[Shape, int]] = {}  # session id -> (shape, version)
        self._version = 0
        # sessions whose shape is to be worked out again at the next pass (they began to wait,
        # or their actions changed); all of them when `action_room` grew (`_room` is older)
        self._stale: dict[str, None] = {}
        self._room = st.config.session_action_demand  # (`action_room` as it starts)
        # the shapes that found no node at the last pass, and each node (with its `grown`) as
        # that pass saw it: a node whose capacity has not come back since has no room for
        # them now either, so the next pass looks for them only on the others (issue 40)
        self._blocked: set[Shape] = set()
        self._seen: dict[str, tuple[NodeState, int]] = {}
        # a waiting session lost an action since the last pass (`lost`): its shape may have
        # shrunk, so the next event's pass looks again though no node's capacity moved (True
        # at the start: one look more, at the first pass, where nothing has room yet)
        self.shrunk = False  # pragma: no mutate
        self.expiry: list[tuple[float, str]] = []  # (when it may expire, session id)
        # what one action of a session may need beyond the session: kept free of other
        # sessions on the session's node (the largest session action seen so far)
        self.action_room: Resources = st.config.session_action_demand
        # node -> the sum of its open sessions' demands, kept as they open and close (`room`
        # asks it for every candidate node of every new session: summing the node's sessions
        # each time made opening a session O(sessions on the node), the whole step quadratic)
        self.held: dict[str, Resources] = {}
        # the alive nodes in `spread`'s order (`rank`), what `spread_all` walks: None until
        # first needed; then touched by `st.index`, to which it is attached, at every change
        # of a node's free capacity, including those of `open` and `close`
        self.ranks: SpreadIndex | None = None
        # node -> the memory_mb its open sessions demand (their caps: `held` sums their charges,
        # which measured use lowers, `sessionmem`); a node takes a new session only while this
        # stays within `CoreConfig.session_memory_overcommit` x its memory (`caps_fit`)
        self.caps: dict[str, float] = {}
        self.overcommit = st.config.session_memory_overcommit

    # ---- opening --------------------------------------------------------------------------------
    def attach(self, rec: ActionRecord) -> None:
        """An action naming a session arrived: the session opens implicitly if unknown (or
        looks for room again), counts it, and the room kept for its actions grows to fit it."""
        st = self.st
        sid = rec.spec.session
        assert sid is not None
        sess = st.sessions.get(sid)
        if sess is None:
            cfg = st.config
            sess = SessionRecord(sid, cfg.session_demand, cfg.session_ttl_s, st.now,
                                 rec.spec.trajectory, rec.spec.task)
            st.sessions[sid] = sess
            rec.note(st.now, f"opens session {sid} implicitly", rec.spec.id)
            self.open(sess, hint=rec)
        elif sess.node is None:  # waiting for room: its first action may need less than assumed
            self.open(sess, hint=rec)
        sess.actions.add(rec.spec.id)
        sess.last_active = st.now
        if sess.node is None:
            self.changed(sess)
        d = rec.spec.demand
        if not d.fits_in(self.action_room):  # the room kept for a session action grows to fit it
            room = self.action_room
            self.action_room = Resources({k: max(room.get(k), d.get(k)) for k in room + d})

    def request(self, e: SessionRequested) -> None:
        st = self.st
        if e.session_id in st.sessions:
            return
        sess = SessionRecord(e.session_id, e.demand, e.ttl_s, e.time, e.trajectory, e.task,
                             e.warm_key, e.attachment)
        st.sessions[e.session_id] = sess
        self.open(sess, pin=e.node)

    def open(self, sess: SessionRecord, pin: str | None = None,
             hint: ActionRecord | None = None) -> None:
        """Open ``sess`` on ``pin`` if it fits there, else where `node_for` finds room; with
        none, it waits (`pending`)."""
        st = self.st
        node = st.nodes.get(pin) if pin else None
        if node is None or not node.alive or not node.fits(sess.demand) \
                or not self.caps_fit(node, sess.demand):
            node = self.node_for(sess, hint)
        if node is None:
            if sess.id not in self.pending:
                self._place += 1
                self.pending[sess.id] = self._place
                self._stale[sess.id] = None
            return
        if self.pending.pop(sess.id, None) is not None:
            self._unwait(sess.id)
        sess.node = node.name
        node.sessions.add(sess.id)
        waiting = st.waiting_on.get(node.name)  # (its actions may already wait: the pass
        if waiting is None:  # drops it there if none does)
            waiting = st.waiting_on[node.name] = set()
        waiting.add(sess.id)
        self.held[node.name] = self.held.get(node.name, _NONE) + sess.charge
        self.caps[node.name] = self.caps.get(node.name, 0.0) + sess.demand.get(MEMORY_MB)
        node.take(sess.charge)
        st.index.update(node.name, node.free)  # (touches `ranks`: the node's sessions changed)
        st.out.append(OpenSession(sess.id, node.name, sess.demand, sess.ttl_s, cause=st.cause,
                                  attachment=sess.attachment))
        heapq.heappush(self.expiry, (sess.last_active + sess.ttl_s, sess.id))
        st.touched.add(session_key(sess.id))

    def open_pending(self) -> None:
        """The sessions waiting for room look again, in the order they began to wait. Once one
        of a shape finds none (`_shape`: its demand, its largest waiting action's, its image;
        outside partitions), the others of that shape are not looked at again in this pass:
        opening only takes room, so they would find none either. Where no policy partitions
        the cluster the pass takes the first of each shape from `_groups`, O((shapes +
        opened) log shapes); else it walks them all (issue 24: with thousands waiting, each
        looked over the nodes at every event)."""
        self.shrunk = False
        if self.st.partitioned:
            self._open_pending_walk()
            return
        stale = self._stale
        if self._room is not self.action_room:  # the shape of one with no action waiting moves
            self._room = self.action_room
            stale = self._stale = dict.fromkeys(self.pending)
        for sid in stale:
            if sid in self.pending:
                self._reshape(sid)
        stale.clear()
        groups = self._groups
        heads: list[tuple[int, str, Shape]] = []
        for shape in list(groups):
            top = self._first(shape)
            if top is not None:
                heads.append((top[0], top[2], shape))
        heapq.heapify(heads)  # (places are unique: the shapes are never compared)
        sessions = self.st.sessions
        before = self._blocked
        blocked: set[Shape] = set()
        grown: list[NodeState] | None = None
        while heads:
            _, sid, shape = heapq.heappop(heads)
            sess = sessions[sid]
            if shape in before:  # no node had room for it: only one whose capacity came back may
                if grown is None:
                    grown = self._grown_since()
                node = self.spread(grown, shape[0], shape[1], False, shape[2]) if grown else None
                if node is not None:  # (`node_for`'s choice: the others still have no room)
                    self.open(sess, pin=node.name)
            else:
                self.open(sess)
            if sess.node is None:
                blocked.add(shape)
                continue  # no room for its shape: the rest of it waits for the next pass
            top = self._first(shape)
            if top is not None:
                heapq.heappush(heads, (top[0], top[2], shape))
        self._blocked = blocked
        if blocked:
            self._seen = {name: (node, node.grown) for name, node in self.st.nodes.items()}

    def _grown_since(self) -> list[NodeState]:
        """The alive nodes whose capacity came back (or that came) since the last pass."""
        seen = self._seen
        out: list[NodeState] = []
        for name, node in self.st.nodes.items():
            if node.alive:
                was = seen.get(name)
                if was is None or was[0] is not node or was[1] != node.grown:
                    out.append(node)
        return out

    def _open_pending_walk(self) -> None:
        """`open_pending` under a partitioning policy: every waiting session in order, bar
        those of a shape that found no room in this pass (a session in a slice or pool has
        no shape: each looks for itself)."""
        st = self.st
        full: set[Shape] = set()
        for sid in list(self.pending):
            sess = st.sessions[sid]
            rec = self._largest_waiting(sess)
            shape = None
            if (rec.partition if rec is not None else self.partitions.session_partition(sess)) is None:
                shape = (sess.demand, self.action_room if rec is None else rec.spec.demand, sess.warm_key)
                if shape in full:
                    continue
            self.open(sess)
            if sess.node is None and shape is not None:
                full.add(shape)

    def changed(self, sess: SessionRecord) -> None:
        """``sess`` gained or lost an action: while it waits, its shape is looked at again at
        the next pass."""
        if sess.id in self.pending:
            self._stale[sess.id] = None

    def lost(self, sess: SessionRecord) -> None:
        """An action of ``sess`` ended (cancelled, failed) while the session waits for room:
        its shape (its largest waiting action's) may be smaller now, and fit where nothing
        freed, so this event's pass looks though no node changed. (There is one: the ended
        action left others queued, which touches the queue; with none left, the shape takes
        `action_room`, which is no smaller than any action seen, and cannot shrink.)"""
        if sess.id in self.pending:
            self._stale[sess.id] = None
            self.shrunk = True

    def _shape(self, sess: SessionRecord) -> Shape:
        """What decides whether a waiting session (no partition) finds room: its demand, the
        room its largest waiting action needs (else `action_room`), its image."""
        rec = self._largest_waiting(sess)
        return (sess.demand, self.action_room if rec is None else rec.spec.demand, sess.warm_key)

    def _reshape(self, sid: str) -> None:
        shape = self._shape(self.st.sessions[sid])
        old = self._entry.get(sid)
        if old is not None:
            if old[0] == shape:
                return
            self._live[old[0]] -= 1
        self._version += 1
        heap = self._groups.get(shape)
        if heap is None:
            heap = self._groups[shape] = []
            self._live[shape] = 0
        heapq.heappush(heap, (self.pending[sid], self._version, sid))
        self._entry[sid] = (shape, self._version)
        live = self._live[shape] = self._live[shape] + 1
        if len(heap) > 2 * live + 16:  # stale entries pile up: keep the live ones
            entry = self._entry
            kept = [e for e in heap if entry.get(e[2]) == (shape, e[1])]
            heapq.heapify(kept)
            self._groups[shape] = kept

    def _unwait(self, sid: str) -> None:
        """``sid`` no longer waits (opened or closed): its entry goes stale."""
        self._stale.pop(sid, None)
        old = self._entry.pop(sid, None)
        if old is not None:
            self._live[old[0]] -= 1

    def _first(self, shape: Shape) -> tuple[int, int, str] | None:
        """The live entry of ``shape``'s group that waited longest (stale ones above it
        dropped; the group too, once empty)."""
        heap = self._groups[shape]
        entry = self._entry
        while heap:
            top = heap[0]
            got = entry.get(top[2])
            if got is not None and got[1] == top[1]:
                return top
            heapq.heappop(heap)
        del self._groups[shape]
        del self._live[shape]
        return None

    def _largest_waiting(self, sess: SessionRecord) -> ActionRecord | None:
        """The waiting action of ``sess`` whose room a node must have: the most memory, then
        the last to arrive (`_memory_then_seq`, the larger seq; None: none waits)."""
        st = self.st
        recs = [st.actions[a] for a in sorted(sess.actions) if a in st.actions]
        return max(recs, key=_memory_then_seq, default=None)

    # ---- closing --------------------------------------------------------------------------------
    def close(self, sess: SessionRecord, reason: str, lost: bool, evicted: bool = False
              ) -> tuple[list[str], str | None]:
        """Close ``sess`` (its node gets its charge back; a CloseSession unless the node is
        lost): the ids of its live actions, in order (the core ends the queued ones, or all
        when ``lost``), and the alive node whose free capacity grew (None: none did; the core
        marks it for the pass)."""
        st = self.st
        del st.sessions[sess.id]
        if self.pending.pop(sess.id, None) is not None:
            self._unwait(sess.id)
        node = st.nodes.get(sess.node) if sess.node else None
        grew: str | None = None
        if node is not None and sess.id in node.sessions:
            node.sessions.discard(sess.id)
            waiting = st.waiting_on.get(node.name)
            if waiting is not None:
                waiting.discard(sess.id)  # (its queued actions end with it: none waits)
            if node.sessions:
                self.held[node.name] = self.held[node.name] - sess.charge
                self.caps[node.name] -= sess.demand.get(MEMORY_MB)
            else:  # the last one: back to exactly nothing (no float residue kept)
                self.held.pop(node.name, None)
                self.caps.pop(node.name, None)
            node.give(sess.charge)
            if node.alive:
                st.index.update(node.name, node.free)  # (touches `ranks`, as in `open`)
                grew = node.name
        if node is not None and not lost:
            close = EvictSession if evicted else CloseSession
            st.out.append(close(sess.id, node.name, reason=reason, cause=st.cause))
        return sorted(sess.actions), grew

    def expired(self) -> list[SessionRecord]:
        """The open sessions whose TTL ran out with no live action, in the order they expired
        (a busy one is looked at again a TTL later)."""
        st = self.st
        heap, now = self.expiry, st.now
        out: list[SessionRecord] = []
        seen: set[str] = set()
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            sess = st.sessions.get(sid)
            if sess is None or sess.node is None or sid in seen:
                continue
            deadline = sess.last_active + sess.ttl_s
            if sess.actions:  # busy: look again later
                heapq.heappush(heap, (now + sess.ttl_s, sid))
                continue
            if deadline > now:
                heapq.heappush(heap, (deadline, sid))
                continue
            seen.add(sid)
            out.append(sess)
        return out

    # ---- where ----------------------------------------------------------------------------------
    def node_for(self, sess: SessionRecord, hint: ActionRecord | None) -> NodeState | None:
        """Where a session opens: only where it and one of its actions can always run (the
        sessions already there, this one and the room for an action within capacity) and it
        fits now; inside its trajectory's slice or task's pool for partitioned policies; else
        spread: fewest sessions per core, then most free CPU. Among the candidates with room,
        nodes warm for the session's `warm_key` (an image they hold) come first; without one
        the spread decides and the session pays the cold cost there. None: it waits for room."""
        st, parts = self.st, self.partitions
        rec = hint
        if rec is None:  # a pending session: open it where its waiting actions can run
            rec = self._largest_waiting(sess)
        act = self.action_room if rec is None else rec.spec.demand
        part = rec.partition if rec is not None else parts.session_partition(sess)
        if part is not None:
            if parts.stale:
                parts.compute()
            # a trajectory's slice: its largest piece; a task's pool: spread over its pieces
            got = self.spread([st.nodes[n] for n, _ in parts.pieces.get(part, ())],
                              sess.demand, act, parts.whole_slice, sess.warm_key)
            if got is not None:
                return got
        return self.spread_all(sess.demand, act, sess.warm_key)

    def spread_all(self, demand: Resources, act: Resources, warm_key: str | None) -> NodeState | None:
        """`spread` over every node (the same choice), through `ranks`: the nodes warm for
        ``warm_key`` first (`Placer.warm_nodes`), then every node in rank order, the first
        with room; past `_TRIES` nodes without room, `spread` over them all."""
        st = self.st
        nodes = st.nodes
        if warm_key is not None:
            warm = self.partitions.placer.warm_nodes.get(warm_key)
            if warm:
                hot = self.spread([nodes[n] for n in warm], demand, act, False, warm_key)
                if hot is not None and hot.warm.get(warm_key, 0) > 0:
                    return hot
        ranks = self.ranks
        if ranks is None:
            ranks = self.ranks = SpreadIndex(self.rank)
            for name in st.index.names():
                ranks.touch(name)
            st.index.spread = ranks
        ranks.refresh()
        need = demand + act
        held = self.held
        got: NodeState | None = None
        tried: list[str] = []
        while True:
            top = ranks.pop()
            if top is None:
                break
            tried.append(top)
            node = nodes[top]
            if node.fits(demand) and (need + held.get(top, _NONE)).fits_in(node.cap) \
                    and self.caps_fit(node, demand):  # `room`
                got = node
                break
            if len(tried) >= _TRIES:  # full nodes ahead: a scan costs less than the heap
                got = self.spread(list(nodes.values()), demand, act, False)
                break
        ranks.push_back(tried)
        return got

    def rank(self, name: str) -> tuple[float, float] | None:
        """A node's place in `spread`'s order, the name aside: its sessions per core with one
        more opened, then its free CPU, negated (None: a node lost or gone)."""
        node = self.st.nodes.get(name)
        if node is None or not node.alive:
            return None
        return ((len(node.sessions) + 1) / max(node.cap.get(CPU, 0.0), 1e-9),
                -node.free.get(CPU, 0.0))

    def spread(self, nodes: list[NodeState], demand: Resources, act: Resources, largest: bool,
               warm_key: str | None = None) -> NodeState | None:
        """Of ``nodes`` with room for the session, one warm for ``warm_key`` first (if any
        is); then (with ``largest``) the first in order, else the one that holds the fewest
        sessions per core, then has the most free CPU, then the first name."""
        best: NodeState | None = None
        best_key = (math.inf, math.inf, 0.0, "")
        need = demand + act
        for node in nodes:
            if not node.alive or not node.fits(demand):
                continue
            if not (need + self.held.get(node.name, _NONE)).fits_in(node.cap):  # `room`
                continue
            if not self.caps_fit(node, demand):
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

    def room(self, node: NodeState, demand: Resources, act: Resources) -> bool:
        """Whether a session of ``demand`` fits ``node`` now and, with the node's other
        sessions, still leaves room for an action ``act`` of any of them, for good."""
        return node.fits(demand) and (demand + act + self.held.get(node.name, _NONE)).fits_in(node.cap) \
            and self.caps_fit(node, demand)

    def caps_fit(self, node: NodeState, demand: Resources) -> bool:
        """Whether the memory the sessions on ``node`` demand, with ``demand``, stays within the
        overcommit bound (always, while every session is charged its demand: `room` then
        asks more)."""
        mem = demand.get(MEMORY_MB)
        return mem <= 0.0 or \
            self.caps.get(node.name, 0.0) + mem <= self.overcommit * node.cap.get(MEMORY_MB, 0.0) + 1e-6


_NONE = Resources()
_TRIES = 16  # nodes `spread_all` tries in rank order before it scans them all


# (sort keys as module functions, not lambdas: mypyc 2.4 crashes on a lambda that closes over
# a local of a method)
def _memory_then_seq(r: ActionRecord) -> tuple[float, int]:
    return (r.spec.demand.get("memory_mb"), r.seq)
