"""The scheduling pass: queues, ordering, aging, and which queue heads are tried where.

Invariant: after `schedule` returns, every queue's head is blocked -- no queued action of the
shared pool fits any alive node that is not reserved for an aged action (work conservation),
and a partition or session queue's head does not fit where it may go.

The queues and their order are `queues.Queues`; where a head goes (node choice, starting it,
reservations, warm executors) is `placement.Placer`, for an elastic head `elastic.Elastic`, in
a partition `partitioning.Partitions`. Actions of the shared pool are queued per *demand shape*
(`ShapeKey`), so one pass costs O(shapes + placements), never O(pending): a blocked head blocks
its whole shape; after a finish only the freed node is tried (`fill_node`).

The pass is one loop, `run_pass`. Two copies of it stay, each with what its case makes constant
folded: `fill_node` (one alive node without sessions freed capacity, no queue touched: the
common finish) and `drain_one` (one queue touched, nothing freed: the common arrival). They pay
under mypyc: sending both cases through `run_pass` gives the same decisions (golden streams 0
of 46 differ) but bench_core ran 4% (fifo) and 8% (tangram) slower, the median of 16
alternating pairs, compiled (docs/core.md, "Performance"). A change to the placement rule is
made in all three.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from .elastic import Elastic
from .fit import fits_besides_cpu
from .lending import Lending
from .partitioning import Partitions
from .placement import Placer
from .queues import AGED, Entry, HeadStream, Queues, head_need
from .records import (
    ActionRecord,
    NodeState,
    QueueKey,
    ShapeKey,
    is_model_key,
    is_partition_key,
    partition_key,
    session_key,
)
from .resources import CPU, MEMORY_MB
from .state import CoreState, ParkedGroup

_NO_GROUP = -1  # pragma: no mutate (a pass heap entry's group: none; any value not an index)


class _ShortNodes:
    """What is left in a `SchedulingPass.run_pass` heap, to end the pass once every head left
    would fail (issue 40: a crowded node's pass tried each of its thousands of waiting
    sessions to start one or none). Per node: the session heads left that can start only
    there (a session's, no slice) and the least CPU one of them needs (a rigid head its
    demand's, an elastic one its minimum); every other entry (a shared-pool or slice queue's
    head, a parked group's, one whose session has no node) counts in ``others``.

    The pass ends (`all_short`) when no other entry is left and on each node with heads left
    the free CPU plus what its elastic actions lend above their minimums (`Elastic.lendable`)
    is below the least need there by a margin (1e-6, over the 1e-9 tolerances of
    `NodeState.fits`, `Elastic.reclaim` and `Elastic.width_on`): every head left would fail in
    `try_place` then, as nothing in a pass frees CPU on a node, and change nothing (a rigid
    head: no fit, a reclaim that cannot make room; an elastic one: no width of its minimum)
    once the marks a failure leaves are there: its node reserved, where an aged head is popped
    (`Placer.reserve_for`: so each node with aged heads left must be reserved already; one
    with none left needs no mark, as no try of a head not aged reserves anything), and marked
    for expansion where a waiting elastic head has CPU free (`try_place`). Not with a standing
    reserve (`reserve_fraction`: its widths)."""

    def __init__(self, sp: SchedulingPass) -> None:
        self.sp = sp
        self.others = 0
        self.left: dict[str, int] = {}  # node -> session heads left that start only there
        self.elastic_left: dict[str, int] = {}  # node -> of those, elastic (the lane rule's)
        self.aged_left: dict[str, int] = {}  # node -> of those, aged (their tries reserve it)
        self.done: set[str] = set()  # nodes where every head left fails, changing nothing (`settled`)
        self.need: dict[str, float] = {}  # node -> the least CPU one of them needs (a lower bound)
        self.rest: dict[str, HeadStream] = {}  # node -> its stream, heads left in it (`add_rest`)
        self.moved = True  # (whether `all_short` may answer otherwise than last time)
        self.short = False  # pragma: no mutate (`_weigh`'s last answers: read only after it, ``moved``)
        self.reserved = False  # pragma: no mutate (as above)

    def _node_of(self, key: QueueKey, rec: ActionRecord, g: int) -> str | None:
        if g >= 0 or type(key) is ShapeKey or key[0] != "sess" or rec.partition is not None:
            return None
        sess = self.sp.st.sessions.get(key[1])
        return None if sess is None else sess.node

    def add(self, key: QueueKey, rec: ActionRecord, g: int, aged: bool) -> None:
        """An entry onto the heap (``aged``: its rank is `AGED`)."""
        name = self._node_of(key, rec, g)
        if name is None:
            self.others += 1
            return
        self.left[name] = self.left.get(name, 0) + 1
        if aged:
            self.aged_left[name] = self.aged_left.get(name, 0) + 1
        elastic_policy = self.sp.st.elastic_policy
        if rec.elastic and elastic_policy:
            self.elastic_left[name] = self.elastic_left.get(name, 0) + 1
        need = head_need(rec, elastic_policy)
        if need < self.need.get(name, math.inf):  # pragma: no mutate (<=: the same value kept)
            self.need[name] = need

    def remove(self, key: QueueKey, rec: ActionRecord, g: int, aged: bool) -> None:
        """A popped entry, once `all_short` has weighed it."""
        name = self._node_of(key, rec, g)
        if name is None:
            self.others -= 1
            self.moved = True
            return
        n = self.left[name] - 1
        self.left[name] = n
        if n == 0:
            self.moved = True  # (a node fewer to weigh)
        if aged:
            n = self.aged_left[name] - 1
            self.aged_left[name] = n
            if n == 0:
                self.moved = True  # (a node fewer that must be reserved)
        if rec.elastic and self.sp.st.elastic_policy:
            self.elastic_left[name] -= 1

    def add_rest(self, name: str, stream: HeadStream) -> None:
        """Node ``name``'s `HeadStream` in the pass: the heads left in it count as heads left
        on the node, with the stream's bounds (its least need, whether one is elastic)."""
        self.rest[name] = stream

    def rest_done(self, name: str) -> None:
        """Node ``name``'s stream has no heads left."""
        if self.rest.pop(name, None) is not None:  # pragma: no mutate (moved or not: fewer ends of the pass, the same starts)
            self.moved = True  # pragma: no mutate (as above)

    def all_short(self, aged: bool) -> bool:
        """Whether every entry left, the popped one among them, would fail and change nothing
        (above). An ``aged`` popped head's failure would reserve its node (`Placer.reserve_for`):
        for it, every node with aged heads left must already be reserved (a crowded node's first
        aged head reserves it; the ~100 aged heads behind it were each tried for nothing; on
        two crowded nodes, those of one were tried until the other's were reserved too)."""
        if self.others:
            return False  # pragma: no mutate (None: as false to the pass)
        if self.moved:
            self.moved = False
            self.short = self._weigh()
            self.reserved = self.short and self._all_reserved()
        return self.short and (self.reserved or not aged)

    def _all_reserved(self) -> bool:
        """Whether every node with aged heads left is reserved (for one of them)."""
        reserved = self.sp.st.reserved
        return all(n <= 0 or name in reserved for name, n in self.aged_left.items())

    def _weigh(self) -> bool:
        """Whether every node with heads left is short of CPU for them all (`_short_node`)."""
        return all(n <= 0 or self._short_node(name) for name, n in self.left.items())

    def _short_node(self, name: str) -> bool:
        """Whether node ``name`` is short of CPU for every head left there. A node where a
        waiting elastic head has CPU free is short only once marked for expansion
        (`st.expand_at`, what its failed try would do)."""
        sp = self.sp
        st = sp.st
        node = st.nodes[name]
        if not node.alive:
            return False  # pragma: no mutate (None: as false to the pass)
        need = self.need[name]
        elastic = self.elastic_left.get(name, 0) > 0
        rest = self.rest  # (a stream's node is among `left`'s: its next head is in the heap)
        stream = rest.get(name) if rest else None
        if stream is not None:
            if stream.need < need:  # pragma: no mutate (<=: the same value)
                need = stream.need
            elastic = elastic or stream.elastic  # pragma: no mutate (and: a stream's node is dirty, expanded after the pass with or without the mark)
        free = node.free.get(CPU, 0.0)  # pragma: no mutate (a node of sessions has CPU: never the default)
        if free > 1e-9 and elastic and name not in st.expand_at:  # pragma: no mutate (>=: try_place's edge, 1e-9)
            return False  # pragma: no mutate (None: as false to the pass)
        if st.elastic_policy:
            free += sp.elastic.lendable(node, 0.0)
        return free + 1e-6 < need

    def settled(self, key: QueueKey, rec: ActionRecord, g: int, aged: bool) -> str | None:
        """The node of a popped entry (the popped among the heads left) where it and every
        head left would fail and change nothing for the rest of the pass: short of CPU for
        them all (`_short_node`) and, for an ``aged`` head, reserved already (a head not aged
        is popped only once no aged head is left anywhere: the heap's order). Once so, so until the pass
        ends: nothing in it frees CPU on a node or unmarks one, and a head comes onto a
        node's count later only from a start there or from its stream, whose bounds are
        weighed. None: it must be tried. On two crowded nodes, the aged heads of one, reserved,
        were each tried while the other's first aged head waited behind them in the order."""
        name = self._node_of(key, rec, g)
        if name is None:
            return None
        if name in self.done:
            return name
        if (aged and name not in self.sp.st.reserved) or not self._short_node(name):
            return None
        self.done.add(name)
        return name


class SchedulingPass:
    """The scheduling pass: which queue heads are tried where, in what order, after an event."""

    def __init__(self, st: CoreState, queues: Queues, placer: Placer, elastic: Elastic,
                 partitions: Partitions) -> None:
        self.st = st
        self.queues = queues
        self.placer = placer
        self.elastic = elastic
        self.partitions = partitions
        self.lending: Lending | None = None  # with tenants' shares (Core sets it)
        # (node, key, group) of parked heads whose node's memory fits them, for the next
        # `run_pass` (`candidates` finds them on the dirty nodes)
        self.groups: list[tuple[str, tuple[tuple[tuple[str, float], ...], bool], ParkedGroup]] = []
        # dirty nodes whose waiting heads the next `run_pass` takes from their `HeadStream`s
        # (`candidates` with ``streams``)
        self.streamed: list[str] = []

    # ---- the pass -------------------------------------------------------------------------------
    def candidates(self, streams: bool = False) -> set[QueueKey]:
        """The queues a pass after a change of capacity looks at: the shared pool's, the
        touched ones, the waiting sessions' and the partitions' on the dirty nodes, and the
        parked groups those nodes' memory fits now (onto `groups`). With ``streams``, a dirty
        node's waiting sessions are left to its `HeadStream` (onto `streamed`): the pass takes
        their heads in order as it goes, not all of them up front."""
        keys: set[QueueKey] = set(self.queues.shape_keys)
        touched = self.st.touched
        if touched:
            keys.update(k for k in touched if not is_model_key(k))
        st = self.st
        nodes, part_by_node = st.nodes, self.partitions.by_node
        waiting = self.queues.waiting_sessions
        waiting_on = st.waiting_on
        short_on = st.short_on
        groups = self.groups
        for name in st.dirty:
            if short_on and name in short_on:  # parked heads: the groups the node's memory fits now
                # (`fits_besides_cpu`'s tolerance: a looser one only adds tries that fail and change nothing)
                free = nodes[name].free.get(MEMORY_MB, 0.0) + 1e-9  # pragma: no mutate
                groups.extend((name, k, g) for k, g in short_on[name].items()
                              if g.need <= free)  # pragma: no mutate (< differs at free + 1e-9 only)
            if streams:
                stream = self.queues.streams.get(name)
                if stream is not None and stream.heap:
                    self.streamed.append(name)
                on = None
            else:
                on = waiting_on.get(name)
            if on:  # the node's sessions that may wait (`CoreState.waiting_on`): those that
                sessions = nodes[name].sessions  # no longer do, or left, are dropped here
                gone = [sid for sid in on if sid not in waiting or sid not in sessions]
                for sid in gone:
                    on.discard(sid)
                keys.update(session_key(sid) for sid in on)
            if part_by_node:
                keys.update(partition_key(p) for p in part_by_node.get(name, ()))
        return keys

    def schedule(self) -> None:
        st = self.st
        dirty = st.dirty
        # Shared-pool queues that were blocked after the last pass can only fit on nodes whose
        # free capacity grew since (dirty, or released from a reservation): look only there.
        local: list[NodeState] | None = None
        local_cpu = -1.0
        touched = self.st.touched
        keys: Iterable[QueueKey]
        if dirty:  # capacity changed: every queue may move, reservations are redone
            lazy = not self.st.fair and not self.st.partitioned  # (`run_pass`: `HeadStream`s)
            reserved = self.st.reserved
            freed = dirty | reserved.keys() if reserved else dirty
            reserved.clear()
            if len(freed) == 1 and not touched and not self.partitions.by_node:
                for name in freed:
                    node = self.st.nodes[name]
                if not node.sessions and node.alive:
                    if self.queues.shape_keys:  # the common case: one node, the shared-pool queues
                        if self.st.fair:  # (tenants first: `run_fair`)
                            self.run_fair(list(self.queues.shape_keys), [node], node.free.get(CPU, 0.0))
                        else:
                            self.fill_node(node)
                    return
                keys = self.candidates(lazy)
                if not keys and not self.groups and not self.streamed:
                    return
                if node.alive:
                    local = [node]
                    local_cpu = node.free.get(CPU, 0.0)
                else:
                    local = []
            else:
                keys = self.candidates(lazy)
                if not keys and not self.groups and not self.streamed:
                    return
                if len(freed) <= 32:
                    nodes = self.st.nodes
                    local = [n for n in (nodes[x] for x in (sorted(freed) if len(freed) > 1 else freed))
                             if n.alive]
                    for n in local:
                        c = n.free.get(CPU, 0.0)
                        if c > local_cpu:
                            local_cpu = c
        elif touched:  # only arrivals: queues blocked before stay blocked
            if len(touched) == 1:
                for key in touched:
                    if not is_model_key(key):
                        self.drain_one(key)
                return
            keys = {k for k in touched if not is_model_key(k)}
        else:
            return
        self.run_pass(keys, local, local_cpu)

    def run_pass(self, keys: Iterable[QueueKey], local: list[NodeState] | None, local_cpu: float) -> None:
        """Place queue heads of ``keys`` in priority order until every one is blocked; with
        ``local`` (the nodes whose capacity grew, ``local_cpu`` the most CPU free on one),
        shared-pool heads not touched by this event are only tried there."""
        if self.st.fair:
            self.run_fair(keys, local, local_cpu)
            return
        touched = self.st.touched
        head = self.queues.head
        heap: list[tuple[int, int, QueueKey, ActionRecord, int]] = []  # (rank, seq, key, head, group)
        streamed = self.streamed
        if streamed:
            self.streamed = []
        limit = local_cpu + 1e-9
        plain = not self.st.partitioned  # (slices: their own accounting, see `_short_besides_cpu`)
        for key in keys:
            got = head(key)
            if got is None:
                continue
            rec, e = got
            if e[0] != AGED and key not in touched:
                if type(key) is ShapeKey:
                    if local is not None and rec.cpu > limit:
                        continue  # more CPU than any freed node has: still blocked (aged heads go on)
                elif plain and key[0] == "sess" and self._short_besides_cpu(rec, key[1]):
                    self._park(key[1], rec, e)
                    continue  # its node lacks memory (or another dimension but CPU) for it (issue 40)
            heap.append((e[0], e[1], key, rec, _NO_GROUP))
        groups = self.groups
        if groups:  # each group of parked heads that its node's memory fits: its first head
            self.groups = []
            back: list[list[tuple[int, int, str]]] = [[] for _ in groups]
            for i in range(len(groups)):
                self._next_member(groups, i, heap, back)
        # the dirty nodes' streams: the first head of each (their group: _NO_GROUP - 1 - i),
        # the entries taken off (to go back), the seqs seen (a stream may hold copies)
        sback: list[list[Entry]] = [[] for _ in streamed]
        seen: set[int] = set()
        more = [self._stream_next(streamed, i, heap, sback, seen, None) for i in range(len(streamed))]
        marks = 0  # pragma: no mutate (nodes reserved or marked for expansion, before a try: set there before it is read)
        short: _ShortNodes | None = None  # (parked groups add heads as the pass goes: not with them)
        if plain and not groups and self.st.config.reserve_fraction <= 0.0:  # pragma: no mutate (off: the same starts; on with a reserve or parked groups: no test stream differs, see _ShortNodes)
            short = _ShortNodes(self)
            for h in heap:
                short.add(h[2], h[3], h[4], h[0] == AGED)
            for i, name in enumerate(streamed):
                if more[i]:
                    short.add_rest(name, self.queues.streams[name])
        if len(heap) > 1:
            heapq.heapify(heap)
        while heap:  # entries stay fresh: only the popped queue's head changes in the loop
            aged, _, key, rec, g = heapq.heappop(heap)
            if short is not None:
                if short.all_short(aged == AGED):
                    break  # (this head and every one left would fail, changing nothing: `_ShortNodes`)
                done = short.settled(key, rec, g, aged == AGED)
                short.remove(key, rec, g, aged == AGED)
                if done is not None:  # (not tried; a stream's next is not taken: it rests)
                    if g < _NO_GROUP:  # pragma: no mutate (<=: a settled node's rest dropped at a key's entry: it is never drawn again, nor weighed, as settled)
                        short.rest_done(done)
                    continue
                marks = len(self.st.reserved) + len(self.st.expand_at)  # pragma: no mutate (-: a change missed, fewer ends of the pass, the same starts)
            if local is not None and type(key) is ShapeKey and key not in touched:
                placed, limit = self.try_local(rec, local, limit)
            else:
                placed = self.try_place(rec, key)
            if placed:
                if short is not None:
                    short.moved = True  # pragma: no mutate (False: fewer ends of the pass, the same starts)
                got = head(key) if g >= _NO_GROUP else None  # (a stream's: its next is in the stream)
                if got is not None:
                    e = got[1]
                    heapq.heappush(heap, (e[0], e[1], key, got[0], _NO_GROUP))
                    if short is not None:
                        short.add(key, got[0], _NO_GROUP, e[0] == AGED)  # pragma: no mutate (a touched session key's next head after a start: no event both touches a queue and frees CPU on its node -- an end's or a cancel's heads come from the node's stream, checked in tests/core/test_pass_ends_short.py -- so none is aged here)
            elif aged == AGED:
                self.placer.reserve_for(rec, key)
            if short is not None and not placed and len(self.st.reserved) + len(self.st.expand_at) != marks:
                short.moved = True  # (a node marked: `all_short` may answer otherwise)
            if g < _NO_GROUP:  # a stream's head: the stream's next
                i = _NO_GROUP - 1 - g
                if not self._stream_next(streamed, i, heap, sback, seen, short) and short is not None:
                    short.rest_done(streamed[i])
            elif g != _NO_GROUP:  # a parked head (`CoreState.park`): its group's next, while memory fits
                name, gkey, group = groups[g]
                if placed:
                    self.st.unpark(key[1])  # (its session's next head: looked at as any other)
                    self.queues.to_stream(key[1])
                else:
                    back[g].append((aged, rec.seq, key[1]))
                if (placed or not group.rigid) and \
                        group.need <= self.st.nodes[name].free.get(MEMORY_MB, 0.0) + 1e-9:
                    self._next_member(groups, g, heap, back)
        for i, name in enumerate(streamed):  # what was taken off, back (stale ones dropped later)
            sheap = self.queues.streams[name].heap
            for e in sback[i]:
                heapq.heappush(sheap, e)
        if groups:
            for (name, gkey, group), tried in zip(groups, back, strict=True):
                for entry in tried:  # (still parked: back on their group)
                    heapq.heappush(group.heap, entry)
                if not group.heap:
                    self.st.short_on[name].pop(gkey, None)

    def _next_member(self, groups: list[tuple[str, tuple[tuple[tuple[str, float], ...], bool], ParkedGroup]],
                     g: int, heap: list[tuple[int, int, QueueKey, ActionRecord, int]],
                     back: list[list[tuple[int, int, str]]]) -> None:
        """Onto the pass's ``heap``: the next head of parked group ``g`` in the queues' order,
        one at a time, so that the pass tries a group's heads in the order it would have had
        them all, and stops taking them once its node's memory no longer fits them (each later
        try would fail, changing nothing) or, for rigid heads, once one did not start (a later
        one of the same demand on the same node cannot: within a pass, free capacity and what
        elastic actions could lend only shrink, and a rigid head's failed try changes nothing).
        A session this event touched is in the pass already (its key), so not taken twice."""
        name, gkey, group = groups[g]
        st = self.st
        touched = st.touched
        while True:
            e = st.next_parked(name, gkey[0], group)
            if e is None:
                return
            key = session_key(e[2])
            if key in touched:
                back[g].append(e)
                continue
            got = self.queues.head(key)
            assert got is not None and got[0].seq == e[1]  # (a parked head is its queue's head)
            heapq.heappush(heap, (e[0], e[1], key, got[0], g))
            return

    def _stream_next(self, streamed: list[str], i: int,
                     heap: list[tuple[int, int, QueueKey, ActionRecord, int]],
                     back: list[list[Entry]], seen: set[int], short: _ShortNodes | None) -> bool:
        """Onto the pass's ``heap``: the next live head of stream ``i`` (node ``streamed[i]``'s
        `HeadStream`), in the queues' order; whether there was one. Each live entry taken off
        goes on ``back[i]`` (back onto the stream after the pass: it waits on), but one parked.
        Skipped: a copy of one taken already, one whose queue this event touched (in the pass
        as its key), and a non-aged head short of memory or another dimension but CPU
        (`_short_besides_cpu`, parked where memory is what it lacks, as `run_pass` leaves out
        such a head of its keys). A head that
        starts takes its session's next one onto the stream (`Queues._leave`), so the pass
        sees it in order, as it sees a key's next head. The head taken is counted in
        ``short``, where the pass has one."""
        name = streamed[i]
        sheap = self.queues.streams[name].heap
        stream_head = self.queues.stream_head
        touched = self.st.touched
        while sheap:
            e = heapq.heappop(sheap)
            rec = stream_head(name, e)
            if rec is None or e[1] in seen:
                continue
            seen.add(e[1])
            sid = e[3]
            key = session_key(sid)
            if key not in touched and e[0] != AGED and self._short_besides_cpu(rec, sid):
                self._park(sid, rec, e)
                if sid not in self.st.parked:  # (short of another dimension: it waits on here)
                    back[i].append(e)
                continue
            back[i].append(e)
            if key in touched:
                continue
            g = _NO_GROUP - 1 - i
            heapq.heappush(heap, (e[0], e[1], key, rec, g))
            if short is not None:
                short.add(key, rec, g, e[0] == AGED)
            return True
        return False

    def _short_besides_cpu(self, rec: ActionRecord, sid: str) -> bool:
        """Whether session ``sid``'s head ``rec`` cannot start in this pass whatever else
        starts first: its session's node (one without GPUs) lacks a dimension other than CPU
        for it. `try_place` would say no (a rigid head: `reclaim` stretches CPU only; an
        elastic one: `fits_besides_cpu`), and no try in a pass frees memory on a CPU node
        (starts take, reclaims give back CPU, parked models free GPUs), so a head not aged
        (whose failure reserves nothing) is left out of the pass: on a crowded node (issue 40)
        the sessions waiting for memory there were each tried on every event of the node."""
        sess = self.st.sessions.get(sid)
        node = self.st.nodes.get(sess.node) if sess is not None and sess.node is not None else None
        # (no node, a partition's head: never while the pass looks at it, kept safe all the same)
        return (node is not None and rec.partition is None and node.cap.get("gpu", 0.0) <= 0.0
                and not fits_besides_cpu(node, rec.shape))

    def _park(self, sid: str, rec: ActionRecord, entry: tuple[int, int, int, str]) -> None:
        """Session ``sid``'s head ``rec`` (queue ``entry``), left out of the pass
        (`_short_besides_cpu`), parked (`CoreState.park`) when it is memory it lacks: the passes
        over its node leave it out, without a look, until the node's free memory reaches what
        it needs (`candidates`) or its queue changes (`Core`'s flush, `Queues`). One short of
        another dimension only stays in the node's set, looked at by each pass as before."""
        sess = self.st.sessions[sid]
        assert sess.node is not None  # (`_short_besides_cpu` found its node)
        node = self.st.nodes[sess.node]
        for dim, need in rec.shape:
            if dim == MEMORY_MB:
                if need > node.free.get(MEMORY_MB, 0.0) + 1e-9 and need > 1e-9:
                    rigid = not (rec.elastic and self.st.elastic_policy)
                    self.st.park(sid, sess.node, rec.shape, need, rigid, entry[0], entry[1])
                return

    def run_fair(self, keys: Iterable[QueueKey], local: list[NodeState] | None, local_cpu: float) -> None:
        """`run_pass` with tenants (`CoreConfig.tenant_shares`; docs/core.md, "Tenants' fair
        share"): the heads are grouped by tenant, and each try goes to the tenant whose
        dominant share of what is in use, over its weight, is least (DRF, `CoreState
        .tenant_rank`; ties to the better head), inside it to its best head in the policy's
        order (aged first, then rank, then arrival) -- until every head is blocked, as in
        `run_pass`: the order of the tries changes, not which fit (work-conserving)."""
        st = self.st
        touched = st.touched
        head = self.queues.head
        heaps: dict[str, list[tuple[int, int, QueueKey, ActionRecord]]] = {}  # tenant -> (rank, seq, key, head)
        lending = self.lending
        limit = local_cpu + 1e-9
        for key in keys:
            got = head(key)
            if got is None:
                continue
            rec, e = got
            if (e[0] != AGED and local is not None and type(key) is ShapeKey and rec.cpu > limit
                    and key not in touched and not (lending is not None and lending.owed(rec))):
                continue  # more CPU than any freed node has: still blocked (aged heads go on,
                # and those owed their tenant's share: lent CPU is taken back for them)
            h = heaps.get(rec.tenant)
            if h is None:
                h = heaps[rec.tenant] = []
            h.append((e[0], e[1], key, rec))
        for h in heaps.values():
            if len(h) > 1:
                heapq.heapify(h)
        while heaps:
            tenant = ""
            best: tuple[float, int, int] | None = None
            for t, h in heaps.items():  # (a few tenants: a scan; their ranks move with each start)
                top = h[0]
                mine = (st.tenant_rank(t), top[0], top[1])
                if best is None or mine < best:
                    best, tenant = mine, t
            h = heaps[tenant]
            aged, _, key, rec = heapq.heappop(h)
            if not h:
                del heaps[tenant]
            if local is not None and type(key) is ShapeKey and key not in touched:
                placed, limit = self.try_local(rec, local, limit)
            else:
                placed = self.try_place(rec, key)
            if not placed and lending is not None and lending.owed(rec):
                placed = self.take_back(rec, key)
                if placed and local:  # (it may have started on a freed node: keep the test exact)
                    limit = max(n.free.get(CPU, 0.0) for n in local) + 1e-9
            if placed:
                got = head(key)
                if got is not None:
                    nxt, e = got
                    h2 = heaps.get(nxt.tenant)
                    if h2 is None:
                        h2 = heaps[nxt.tenant] = []
                    heapq.heappush(h2, (e[0], e[1], key, nxt))
            elif aged == AGED:
                self.placer.reserve_for(rec, key)

    def try_local(self, rec: ActionRecord, local: list[NodeState], limit: float) -> tuple[bool, float]:
        """Try a shared-pool head untouched by this event on the freed nodes ``local`` only,
        after the cheap test (more CPU than ``limit``, the most any of them has, cannot fit);
        returns whether it was placed and the limit, lowered to what they have left after."""
        if rec.elastic and self.st.elastic_policy:  # (its width decides where: elastic.py)
            placed = rec.cpu <= limit and self.elastic.place(rec)
        else:
            placed = rec.cpu <= limit and self.placer.place_among(rec, local)
        if placed:  # the freed nodes have less now: keep the cheap test exact
            most = -1.0
            for n in local:
                c = n.free.get(CPU, 0.0)
                if c > most:
                    most = c
            limit = most + 1e-9
        return placed, limit

    def take_back(self, rec: ActionRecord, key: QueueKey) -> bool:
        """Owed ``rec`` did not fit: start it on CPU its tenant's share takes back from the
        tenants above theirs (lending.py); a shared-pool head on any node, a session's on its
        session's node; never a partition's."""
        lending = self.lending
        assert lending is not None
        if type(key) is ShapeKey:
            return lending.take_back(rec, list(self.st.nodes.values()), True)
        if is_partition_key(key) or rec.partition is not None:
            return False
        sess = self.st.sessions.get(key[1])
        if sess is None or sess.node is None:
            return False
        return lending.take_back(rec, [self.st.nodes[sess.node]], False)

    def try_place(self, rec: ActionRecord, key: QueueKey) -> bool:
        spec = rec.spec
        if type(key) is ShapeKey:
            if rec.elastic and self.st.elastic_policy:
                return self.elastic.place(rec)  # (elastic.py: its width, then its node)
            node = self.placer.find_node(rec)
            if node is None and (not self.st.elastic_policy or (node := self.elastic.lender(rec)) is None):
                return False
            self.placer.start_warm(rec, node)
            return True
        if is_partition_key(key):
            return self.partitions.place(rec, None)
        sess = self.st.sessions.get(key[1])
        if sess is None or sess.node is None:
            return False
        if rec.partition is not None and (rec.partition, sess.node) in self.partitions.quota:
            return self.partitions.place(rec, sess.node)
        node = self.st.nodes[sess.node]
        alloc = spec.demand
        if rec.partition is not None:  # its slice moved away: the node is its slice, CPU capped
            cpu = min(spec.demand.get(CPU, 0.0), node.cap.get(CPU, 0.0))
            alloc = alloc.with_amount(CPU, cpu)
        elif rec.elastic and self.st.elastic_policy:  # its width on its session's node (elastic.py)
            if not fits_besides_cpu(node, rec.shape):
                return False
            width, floor = self.elastic.width_on(rec, node, 0)
            if width <= 0.0:
                if node.free.get(CPU, 0.0) > 1e-9:
                    self.st.expand_at.add(node.name)  # its elastic actions go wide while it waits
                return False
            self.elastic.start(rec, node, width, floor)
            return True
        if not node.fits(alloc) and not (self.st.elastic_policy and self.elastic.reclaim(node, alloc)):
            return False
        self.placer.start(rec, node, alloc, True)
        return True


    def fill_node(self, node: NodeState) -> None:
        """`schedule`'s pass when one alive node without sessions freed capacity and no queue
        was touched: the candidates are the shared-pool queues' heads, the only node to try is
        that one (the loop below is `schedule`'s, with what that case makes constant folded).
        """
        head = self.queues.head
        free = node.free
        limit = free.get(CPU, 0.0) + 1e-9
        heap: list[tuple[int, int, ShapeKey, ActionRecord]] = []  # (rank, seq, key, head)
        no_aged = not self.queues.aged_pushes
        for key, kcpu in self.queues.shape_keys.items():  # (no placement happens before this loop ends)
            if no_aged and kcpu > limit:
                continue  # (below, for a head that cannot be aged: all its queue has that cpu)
            got = head(key)
            if got is None:
                continue
            rec, e = got
            if e[0] != AGED and rec.cpu > limit:
                continue  # more CPU than the node has: still blocked (aged heads go on)
            heap.append((e[0], e[1], key, rec))
        if len(heap) > 1:
            heapq.heapify(heap)
        placer = self.placer
        while heap:
            aged, _, key, rec = heapq.heappop(heap)
            placed = False
            if rec.elastic and self.st.elastic_policy:  # (its width decides where: elastic.py)
                placed = rec.cpu <= limit and self.elastic.place(rec)
                limit = free.get(CPU, 0.0) + 1e-9
            elif rec.cpu <= limit and placer.fits_here(rec, node):
                placer.start_warm(rec, node)
                placed = True
                limit = free.get(CPU, 0.0) + 1e-9
            if placed:
                if no_aged and rec.cpu > limit:
                    continue  # its queue's next head has its cpu (the shape's): cannot fit now
                got = head(key)
                if got is not None:
                    e = got[1]
                    heapq.heappush(heap, (e[0], e[1], key, got[0]))
            elif aged == AGED:
                self.placer.reserve(rec)

    def drain_one(self, key: QueueKey) -> None:
        """`schedule`'s loop when only one queue is a candidate (no freed nodes): place its
        heads until one is blocked; a blocked, aged shared-pool head reserves a node."""
        head = self.queues.head
        got = head(key)
        lending = self.lending
        while got is not None:
            rec = got[0]
            if not self.try_place(rec, key) and not (
                    lending is not None and lending.owed(rec) and self.take_back(rec, key)):
                if got[1][0] == AGED:
                    self.placer.reserve_for(rec, key)
                return
            got = head(key)
