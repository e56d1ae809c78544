"""Placement: which node an action of a queue head goes to, and starting it there.

Invariant: an action is started (`Placer.start`) only on an alive node where its allotment fits
the free capacity (no dimension short by more than 1e-9), never on a node reserved for another
(aged) action; among the candidates it takes the best fit (least leftover dominant share,
`fit.best_fit`), preferring a node with a warm executor for its key. `start` is the only way
from QUEUED to STARTING: it takes the allotment, updates the free index and emits the
StartAction. `warm_nodes` lists, per warm key, exactly the nodes whose warm count for it is > 0.
"""

from __future__ import annotations

from .actions import Status
from .build import make_start
from .fit import UNBOUNDED, best_fit, leftover
from .queues import Queues
from .records import ActionRecord, NodeState, QueueKey, ShapeKey, is_session_key
from .resources import CPU, Resources
from .state import CoreState

_STARTING = Status.STARTING  # (a module constant: cheaper than Status.STARTING)
# Most warm nodes `find_node` looks at per placement before it falls back to the index (which
# still prefers a warm node among its candidates): bounded work when many warm nodes are full.
WARM_SCAN = 64


class Placer:
    """From a queue head to a StartAction on a node; warm executors per node; reservations."""

    def __init__(self, st: CoreState, queues: Queues) -> None:
        self.st = st
        self.queues = queues
        # warm key -> nodes with a warm executor for it; insertion-ordered (a dict, not a set) so
        # that ties between equally good warm nodes break the same way in every process
        self.warm_nodes: dict[str, dict[str, None]] = {}
        # queues whose elastic head waits for a node warm for it (elastic.py), and those to
        # look at again because a warm pool ran dry (`set_warm`)
        self.warm_waiters: dict[QueueKey, None] = {}
        self.rewake: set[QueueKey] = set()
        # node -> the elastic actions started (or shrunk) there, which may be below their
        # maximum: a superset of those, pruned as `Elastic.expand_node` meets the others (the
        # ones that ended, moved or reached their maximum), so expansion looks at the actions
        # that may grow, not at every action running there
        self.growable: dict[str, dict[str, None]] = {}
        self.other_dims = False  # whether an elastic action stretching other than CPU started

    # ---- where ----------------------------------------------------------------------------------
    def find_node(self, rec: ActionRecord) -> NodeState | None:
        """Best fit (least leftover dominant share) among the first few nodes that fit,
        preferring a node with a warm executor for the action's key: warm nodes first, however
        many there are (a large cluster keeps a floor of warm sandboxes on every node), looking
        at no more than `WARM_SCAN` of them; then the free index, fullest first."""
        st = self.st
        nodes, reserved = st.nodes, st.reserved
        shape = rec.shape
        warm_nodes = self.warm_nodes
        wkey = rec.wkey if warm_nodes else ""
        ws = warm_nodes.get(wkey)
        enough = st.config.fit_candidates
        if ws:
            best = best_fit([ws], nodes, reserved, shape, enough, WARM_SCAN, "")
            if best is not None:
                return best
        # (a demand of two dimensions ranks the index's nodes by fit alone: with at most
        # `WARM_SCAN` warm nodes none of them fits anyway, and so it has always decided)
        return best_fit(st.index.buckets_from(rec.cpu), nodes, reserved, shape, enough, UNBOUNDED,
                        "" if len(shape) == 2 else wkey)

    def place_among(self, rec: ActionRecord, nodes: list[NodeState]) -> bool:
        """Best fit of a shared-pool action among a few given nodes (warm first); False when
        none fits."""
        st = self.st
        best = best_fit([{n.name: None for n in nodes}], st.nodes, st.reserved, rec.shape,
                        UNBOUNDED, UNBOUNDED, rec.wkey if self.warm_nodes else "")
        if best is None:
            return False
        self.start_warm(rec, best)
        return True

    def fits_here(self, rec: ActionRecord, node: NodeState) -> bool:
        """Whether ``rec``'s demand fits ``node`` now and the node is not held for another."""
        return node.name not in self.st.reserved and leftover(node, rec.shape) >= 0.0

    # ---- starting -------------------------------------------------------------------------------
    def start_warm(self, rec: ActionRecord, node: NodeState) -> None:
        """Start a shared-pool action at its demand on ``node``, on a warm executor if one is
        there."""
        self.start(rec, node, rec.spec.demand, self.take_warm(node, rec.wkey) if node.warm else False)

    def start(self, rec: ActionRecord, node: NodeState, alloc: Resources, warm: bool) -> None:
        st = self.st
        if st.resident and rec.spec.session is None:
            warm = True  # static stacks keep their sandboxes resident (policies.py)
        quota = alloc  # what the StartAction carries: the executor's limit
        if rec.charge is not None:
            alloc = rec.charge  # admitted by its measured use: the node is charged that
        self.queues.started(rec)
        node.take(alloc)
        if st.fair:
            st.tenant_take(rec.tenant, alloc._d, 1.0)
        spec = rec.spec
        aid = spec.id
        name = node.name
        node.running.add(aid)
        st.index.update(name, node.free)
        rec.node = name
        rec.lent_on = None  # (set below, once it is among the node's elastic runs)
        rec.allot(alloc)
        rec.start_time = now = st.now
        rec.attempts += 1
        cause = st.cause
        rec.move(_STARTING, now, cause)
        out = st.out
        st.start_index[aid] = len(out)
        out.append(make_start(spec, name, quota, warm, cause))  # (StartAction, built fast: build.py)
        rec.done = 0.0  # (its work done so far: `Elastic.remaining`)
        rec.since = now
        if rec.elastic:
            el = spec.elasticity
            if el is not None and el.dim != CPU:
                self.other_dims = True
            st.expand_at.add(name)
            st.elastic_nodes.add(name)  # (elastic.py: where expansion can look)
            self.may_grow(name, aid)
            node.elastic[aid] = rec  # (until `Core._release`)
            if rec.el_cpu:
                rec.el_rank = node.joined
                node.joined += 1
                rec.lent_on = node.lent
                if rec.width > rec.el_min:
                    node.lent[aid] = rec

    def may_grow(self, node: str, aid: str) -> None:
        """Action ``aid`` runs elastic on ``node`` and may be below its maximum (`growable`)."""
        g = self.growable.get(node)
        if g is None:
            g = self.growable[node] = {}
        g[aid] = None
        running = self.st.nodes[node].running
        if len(g) > 2 * len(running) + 16:  # (a full node's are not pruned by expansion)
            self.growable[node] = {a: None for a in g if a in running}

    # ---- reservations ---------------------------------------------------------------------------
    def reserve_for(self, rec: ActionRecord, key: QueueKey) -> None:
        """An aged head is blocked: hold a node for it alone -- for a shared-pool action the
        node closest to fitting it, for a session action its session's node (so that new
        work and elastic growth stop taking what it waits for)."""
        st = self.st
        if type(key) is ShapeKey:
            self.reserve(rec)
        elif is_session_key(key):
            sess = st.sessions.get(key[1])
            if sess is not None and sess.node is not None and sess.node not in st.reserved:
                st.reserved[sess.node] = rec.spec.id

    def reserve(self, rec: ActionRecord) -> None:
        """Hold the node closest to fitting an aged, blocked action for it alone."""
        st = self.st
        demand, nodes, reserved = rec.spec.demand, st.nodes, st.reserved
        for bucket in st.index.buckets_down():
            for name in bucket:
                if name not in reserved and demand.fits_in(nodes[name].cap):
                    reserved[name] = rec.spec.id
                    return

    # ---- warm executors -------------------------------------------------------------------------
    def take_warm(self, node: NodeState, key: str) -> bool:
        n = node.warm.get(key, 0) if node.warm else 0
        if n > 0:
            self.set_warm(node, key, n - 1)
            return True
        return False

    def set_warm(self, node: NodeState, key: str, n: int) -> None:
        node.warm[key] = n
        s = self.warm_nodes.setdefault(key, {})
        if n > 0:
            s[node.name] = None
        else:
            s.pop(node.name, None)
            if self.warm_waiters:  # heads that wait for a warm node look again
                self.rewake.update(self.warm_waiters)
                self.warm_waiters.clear()

    def wait_for_warm(self, key: QueueKey) -> None:
        """Queue ``key``'s head waits for a node warm for it: it looks again when a warm pool
        runs dry (`set_warm`)."""
        self.warm_waiters[key] = None

    def woken(self) -> set[QueueKey]:
        """The queues to look at again because a warm pool ran dry (and forget them)."""
        keys = self.rewake
        self.rewake = set()
        return keys
