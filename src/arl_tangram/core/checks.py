"""`Core.validate` and `Core.view`: read-only walks over the core's state.

Invariant: nothing here mutates the core. `validate` recomputes every derived quantity from the
primary records and raises ``AssertionError`` naming the first broken invariant.
"""

from __future__ import annotations

from typing import Protocol

from .actions import Status
from .elastic import Elastic
from .fit import fits_besides_cpu
from .lending import Lending
from .modelsched import ModelPlanner
from .providers import Providers
from .queues import AGED, Queues
from .records import (
    ActionRecord,
    InstanceRecord,
    InstState,
    NodeState,
    QueueKey,
    is_session_key,
    model_key,
    session_key,
)
from .resources import CPU, MEMORY_MB, Resources, total
from .sessions import Sessions
from .state import CoreState
from .view import CoreView, InstanceView, NodeView, SessionView


class Core(Protocol):
    """What `validate` and `build_view` read of a `core.Core` (its parts, never changed here)."""

    st: CoreState
    queues: Queues
    elastic: Elastic
    planner: ModelPlanner
    arrived: int
    delivered: int
    terminal: dict[Status, int]
    sessions: Sessions
    providers: Providers
    lending: Lending | None

S = Status
_EPS = 1e-6


def _check(ok: bool, name: str, detail: str) -> None:
    if not ok:
        raise AssertionError(f"invariant {name} broken: {detail}")


def validate(core: Core) -> None:
    _check_nodes(core)
    _check_actions(core)
    _check_sessions(core)
    _check_instances(core)
    _check_work_conserving(core)
    _check_sessions_served(core)
    _check_elastic_sets(core)
    _check_waiting_sessions(core)
    if core.st.fair:
        _check_tenants(core)


def _check_tenants(core: Core) -> None:
    """Fair share: each tenant's use (`CoreState.tenant_use`) is the sum of what its running
    actions hold on alive nodes, and a shared-pool action waits in its own tenant's queue."""
    st = core.st
    expect: dict[str, dict[str, float]] = {}
    for rec in st.actions.values():
        if rec.status in (S.STARTING, S.RUNNING) and rec.batch is None and rec.node is not None:
            node = st.nodes[rec.node]
            if node.alive and rec.spec.id in node.running and rec.allotment is not None:
                d = expect.setdefault(rec.tenant, {})
                for k, v in rec.allotment.items():
                    d[k] = d.get(k, 0.0) + v
        key = rec.queue_key
        if rec.status is S.QUEUED and type(key) is type(rec.skey):
            _check(getattr(key, "tenant", None) == rec.tenant, "tenant-queue",
                   f"{rec.spec.id} of tenant {rec.tenant!r} queued in {key!r}")
    for t in set(expect) | set(st.tenant_use):
        got, want = st.tenant_use.get(t, {}), expect.get(t, {})
        for k in set(got) | set(want):
            u, x = got.get(k, 0.0), want.get(k, 0.0)
            _check(abs(u - x) <= _EPS, "tenant-use", f"tenant {t!r} {k}: use {u} vs holdings {x}")


def _check_waiting_sessions(core: Core) -> None:
    """Each session waiting for room is in the group of its shape, once (where no policy
    partitions the cluster; `Sessions.open_pending` tries the groups' first ones)."""
    sessions = core.sessions
    if core.st.partitioned:
        return
    live = [e for shape, heap in sessions._groups.items() for e in heap
            if sessions._entry.get(e[2]) == (shape, e[1])]
    place_of = {e[2]: e[0] for e in live}
    _check(len(live) == len(place_of), "waiting-once", f"{sorted(e[2] for e in live)}")
    for sid, place in sessions.pending.items():
        _check(sid in core.st.sessions and core.st.sessions[sid].node is None, "waiting-session", sid)
        if sid in sessions._stale or sessions._room is not sessions.action_room:
            continue  # (its shape is worked out at the next pass)
        got = sessions._entry.get(sid)
        _check(got is not None and got[0] == sessions._shape(core.st.sessions[sid]), "waiting-shape", sid)
        _check(place_of.get(sid) == place, "waiting-place", sid)
    for sid in sessions._entry:
        _check(sid in sessions.pending, "waiting-gone", sid)


def _check_elastic_sets(core: Core) -> None:
    """What `Elastic.expand_node` walks instead of every running action: each elastic action
    running below its maximum is in its node's `Placer.growable`, the elastic actions running
    on a node are exactly its `NodeState.elastic`, and each one's `width` and `rate` follow its
    allotment (`ActionRecord.allot`)."""
    placer = core.elastic.placer
    for name, node in core.st.nodes.items():
        growable = placer.growable.get(name, {})
        running_elastic: list[str] = []
        for aid in node.running:
            rec = core.st.actions.get(aid)
            el = rec.spec.elasticity if rec is not None else None
            if rec is None or el is None or rec.allotment is None or not rec.elastic:
                continue
            running_elastic.append(aid)
            _check(node.elastic.get(aid) is rec, "elastic-registry", f"{aid} on {name}")
            _check(rec.width == rec.allotment.get(el.dim)
                   and rec.rate in (-1.0, rec.spec.speed(rec.allotment)), "allotment-derived",
                   f"{aid}: width {rec.width}, rate {rec.rate} at {rec.allotment}")
            if rec.allotment.get(el.dim) < el.max - 1e-9:
                _check(aid in growable, "elastic-growable", f"{aid} on {name}")
        _check(len(running_elastic) == len(node.elastic), "elastic-registry",
               f"{name}: {sorted(node.elastic)} registered, {sorted(running_elastic)} run")
        above = sorted(aid for aid, rec in node.elastic.items() if rec.el_cpu and rec.width > rec.el_min)
        _check(sorted(node.lent) == above and all(node.lent[a] is node.elastic[a] for a in above),
               "elastic-lent", f"{name}: {sorted(node.lent)} kept as lending, {above} above their minimum")
        ranks = [rec.el_rank for rec in node.elastic.values() if rec.el_cpu]
        _check(ranks == sorted(ranks), "elastic-lent", f"{name}: ranks {ranks} not in its order")


def _check_nodes(core: Core) -> None:
    expect: dict[str, dict[str, float]] = {n: {} for n in core.st.nodes}

    def add(node: str, r: Resources) -> None:
        d = expect[node]
        for k, v in r.items():
            d[k] = d.get(k, 0.0) + v

    for rec in core.st.actions.values():
        if rec.status in (S.STARTING, S.RUNNING) and rec.batch is None and rec.node is not None:
            node = core.st.nodes[rec.node or ""]
            if node.alive:
                _check(rec.spec.id in node.running, "running-on-node", f"{rec.spec.id} not in {node.name}.running")
                assert rec.allotment is not None
                add(node.name, rec.allotment)
    for sess in core.st.sessions.values():
        if sess.node is not None and core.st.nodes[sess.node].alive:
            add(sess.node, sess.charge)
    for inst in core.planner.instances.values():
        add(inst.node, inst.holding())
    lending = core.lending
    if lending is not None:  # (anticipation: CPU held for a tenant between two of its actions)
        for name, (node, _, cpu, _) in lending.holds.items():
            _check(core.st.nodes.get(name) is node, "hold-node", f"hold on a replaced node {name}")
            add(name, Resources({CPU: cpu}))  # (alive: a lost node's hold went with it)
    for name, node in core.st.nodes.items():
        if not node.alive:
            continue
        for k in set(node.used) | set(expect[name]):
            u, x = node.used.get(k, 0.0), expect[name].get(k, 0.0)
            _check(abs(u - x) <= _EPS, "used-equals-holdings", f"{name}.{k}: used {u} vs holdings {x}")
            _check(u <= node.cap.get(k, 0.0) + _EPS, "capacity", f"{name}.{k}: {u} > {node.cap.get(k, 0.0)}")
        for aid in node.running:
            held = core.st.actions.get(aid)
            _check(held is not None and held.node == name, "running-set", f"{aid} on {name}")
        _check(name in core.st.index, "index", f"alive node {name} not indexed")


def _check_actions(core: Core) -> None:
    _check(core.arrived == core.delivered + len(core.st.actions), "one-deliver-each",
           f"arrived {core.arrived} != delivered {core.delivered} + live {len(core.st.actions)}")
    live: dict[QueueKey | None, int] = {}
    entries = {(e[3], e[2], key) for key, q in core.queues.heaps.items() for e in q}
    entries |= {(e[3], e[2], key) for key, subs in core.queues.mheaps.items()  # (tenants)
                for q in subs.values() for e in q}
    providers = core.providers
    for bad in providers.check(core.st.actions):
        _check(False, "providers", bad)
    for aid, rec in core.st.actions.items():
        _check(not rec.status.is_finished, "live-not-finished", f"{aid} is {rec.status.name}")
        _check(rec.status is not S.PENDING, "no-pending-after-handle", aid)
        if providers.holds(aid):  # waits for a provider's token, not in a queue or on a node
            _check(rec.queue_key is None and rec.node is None, "provider-action-off-nodes", aid)
            continue
        if rec.status is S.QUEUED:
            _check(rec.queue_key is not None, "queued-in-queue", aid)
            live[rec.queue_key] = live.get(rec.queue_key, 0) + 1
            _check((aid, rec.gen, rec.queue_key) in entries, "queued-entry", aid)
        else:
            _check(rec.queue_key is None, "active-not-queued", aid)
            node = core.st.nodes.get(rec.node or "")
            _check(node is not None and node.alive, "active-on-alive-node", f"{aid} on {rec.node}")
            if rec.batch is not None:
                _check(rec.batch in core.planner.batches, "batch-known", f"{aid} batch {rec.batch}")
            el = rec.spec.elasticity
            if el is not None and rec.allotment is not None and rec.partition is None:
                k = rec.allotment.get(el.dim)
                _check(el.min - _EPS <= k <= el.max + _EPS, "allotment-in-range", f"{aid}: {k}")
    _check(live == {k: v for k, v in core.queues.live.items() if v}, "queue-counts", f"{live} vs {core.queues.live}")
    waiting = {k[1] for k in live if k is not None and is_session_key(k)}
    _check(waiting == core.queues.waiting_sessions, "waiting-sessions",
           f"{sorted(waiting)} vs {sorted(core.queues.waiting_sessions)}")
    for sid in waiting:  # the pass finds each waiting session through its node
        sess = core.st.sessions.get(sid)
        _check(sess is not None, "waiting-session-known", sid)
        assert sess is not None
        if sess.node is not None:
            _check(sid in core.st.waiting_on.get(sess.node, ()) or sid in core.st.parked,
                   "waiting-on-node", f"{sid} on {sess.node}")
            if sid not in core.st.parked:  # its head in its node's stream (`HeadStream`)
                got = core.queues.head(session_key(sid))
                stream = core.queues.streams.get(sess.node)
                _check(got is not None and stream is not None
                       and (*got[1][:3], sid) in stream.heap, "head-in-stream", f"{sid} on {sess.node}")
    for sid, (shape, seq) in core.st.parked.items():  # parked: its head, in its node's group
        sess = core.st.sessions.get(sid)
        _check(sid in waiting and sess is not None and sess.node is not None, "parked-waits", sid)
        assert sess is not None and sess.node is not None  # pragma: no mutate (for mypy: checked above)
        got = core.queues.head(session_key(sid))
        assert got is not None
        rec, entry = got
        need = dict(shape).get(MEMORY_MB, 0.0)  # pragma: no mutate (a parked shape has memory)
        _check(entry[0] != AGED and entry[1] == seq and rec.shape == shape, "parked-head",
               f"{sid}: {entry} {rec.shape}, parked with {seq} {shape}")
        rigid = not (rec.elastic and core.st.elastic_policy)
        group = core.st.short_on.get(sess.node, {}).get((shape, rigid))
        _check(group is not None and group.need == need and (entry[0], seq, sid) in group.heap,
               "parked-in-its-group", sid)


def _check_sessions(core: Core) -> None:
    for name, node in core.st.nodes.items():  # the running sum `Sessions.room` reads
        want = total(core.st.sessions[sid].charge for sid in node.sessions if sid in core.st.sessions)
        got = core.sessions.held.get(name, Resources())
        _check(all(abs(got.get(k) - want.get(k)) < 1e-6 for k in set(got) | set(want)),
               "session-demand-sum", f"{name}: {got} vs {want}")
        caps = sum(core.st.sessions[sid].demand.get("memory_mb") for sid in node.sessions
                   if sid in core.st.sessions)  # the sum `Sessions.caps_fit` reads
        _check(abs(core.sessions.caps.get(name, 0.0) - caps) < 1e-6, "session-caps-sum",
               f"{name}: {core.sessions.caps.get(name, 0.0)} vs {caps}")
    ranks = core.sessions.ranks
    if ranks is not None:  # the order `Sessions.spread_all` walks: every alive node, as it is now
        entries = set(ranks.heap)
        for name in core.st.nodes:
            if name in ranks.dirty:
                continue
            rank = core.sessions.rank(name)
            _check(ranks.rank.get(name) == rank, "spread-rank", f"{name}: {ranks.rank.get(name)} vs {rank}")
            if rank is not None:
                _check((rank[0], rank[1], name) in entries, "spread-heap", name)
    for sid, sess in core.st.sessions.items():
        _check(sess.charge.fits_in(sess.demand), "session-charge-within-demand",
               f"{sid}: {sess.charge} vs {sess.demand}")
        if sess.node is not None:
            _check(sid in core.st.nodes[sess.node].sessions, "session-on-node", sid)
        for aid in sess.actions:
            rec = core.st.actions.get(aid)
            _check(rec is not None, "session-action-live", f"{sid}: {aid}")
            assert rec is not None
            if rec.status in (S.STARTING, S.RUNNING):
                _check(rec.node == sess.node, "session-node", f"{aid} on {rec.node}, session on {sess.node}")


def _check_instances(core: Core) -> None:
    for iid, inst in core.planner.instances.items():
        node = core.st.nodes[inst.node]
        _check(node.alive and iid in node.instances, "instance-on-node", iid)
        doms = node.spec.gpu_domains or (tuple(range(node.spec.gpu_count)),)
        _check(any(set(inst.devices) <= set(d) for d in doms), "one-nvlink-domain", f"{iid}: {inst.devices}")
        _check(not (set(inst.devices) & node.dev_free), "devices-held", iid)
        others = [o for o in core.planner.instances.values() if o.node == inst.node and o.id != iid]
        _check(all(not set(o.devices) & set(inst.devices) for o in others), "devices-exclusive", iid)
        if inst.state is InstState.READY and inst.model.max_seqs > 0:  # continuous batching
            live = core.queues.live.get(model_key(inst.model.name), 0)
            _check(not live or inst.seqs() >= inst.model.max_seqs, "free-sequence-with-queue", iid)
            _check(inst.seqs() <= inst.model.max_seqs, "sequences-within-max", iid)
        elif inst.state is InstState.READY and inst.batch is None and core.st.config.max_batch_wait_s == 0:
            live = core.queues.live.get(model_key(inst.model.name), 0)
            held = live < inst.model.knee_batch and core.planner.staggered(inst.model)
            _check(not live or held, "idle-instance-with-queue", iid)
        _check(inst.batch is not None or not inst.more, "more-only-beside-batch", iid)


def _check_work_conserving(core: Core) -> None:
    """No queued shared-pool action fits an alive, unreserved node (a pass leaves none). Under
    an elastic policy an elastic head may wait for its width (elastic.py), but no CPU idles
    meanwhile: on every node that fits it, the free CPU is below its minimum once the node's
    elastic actions took what they can (they grow into it), unless every such node is cold for
    it and it waits for a node warm for it."""
    for key in core.queues.shape_keys:
        got = core.queues.head(key)
        if got is None:
            continue
        if key.elastic and core.st.policy.elastic:
            _check_elastic_head(core, got[0])
            continue
        demand = got[0].spec.demand
        for node in core.st.nodes.values():
            if node.alive and node.name not in core.st.reserved:
                _check(not node.fits(demand), "work-conserving",
                       f"{got[0].spec.id} ({demand}) fits free {node.free} of {node.name}")


def _idle_for(core: Core, rec: ActionRecord, node: NodeState) -> bool:
    """Whether ``node`` has CPU for elastic ``rec`` that its own elastic actions cannot take."""
    el = rec.spec.elasticity
    assert el is not None  # (an elastic head: its callers ask only of one)
    if el.dim != "cpu":  # (a width in another dimension: it starts at its minimum)
        return node.fits(rec.spec.demand)
    if not fits_besides_cpu(node, rec.shape):
        return False
    return node.free.get("cpu", 0.0) - core.elastic.absorb(node) >= el.min - 1e-9


def _check_elastic_head(core: Core, rec: ActionRecord) -> None:
    nodes = [n for n in core.st.nodes.values() if n.alive and n.name not in core.st.reserved]
    idle = [n for n in nodes if _idle_for(core, rec, n)]
    if not idle:
        return
    warm_elsewhere = any(n.warm.get(rec.wkey, 0) > 0 for n in nodes if n not in idle)
    cold_here = not core.st.resident and all(n.warm.get(rec.wkey, 0) <= 0 for n in idle)
    _check(warm_elsewhere and cold_here, "work-conserving",
           f"elastic {rec.spec.id} waits while {idle[0].name} has idle CPU {idle[0].free}")


def _check_sessions_served(core: Core) -> None:
    """No session action waits while its session's node could run it now, and no session
    waits to open while some node has room for it and one of its actions (shared pool)."""
    if core.st.policy.partitioned is not None:
        return  # (a slice or pool runs its own actions, one at a time for trajectories)
    for sess in core.st.sessions.values():
        if sess.node is None:
            nodes = [n for n in core.st.nodes.values() if n.alive]
            recs = [core.st.actions[a] for a in sess.actions if a in core.st.actions]
            act = max(recs, key=lambda r: (r.spec.demand.get("memory_mb"), r.seq)).spec.demand \
                if recs else core.sessions.action_room  # (as `Sessions.node_for` chooses)
            _check(not any(core.sessions.room(n, sess.demand, act) for n in nodes),
                   "session-waits", f"{sess.id} could open on a node with room")
            continue
        got = core.queues.head(session_key(sess.id))
        node = core.st.nodes.get(sess.node)
        if got is None or node is None or not node.alive:
            continue
        if got[0].elastic and core.st.policy.elastic:  # it may wait for its width, not idle CPU
            _check(not _idle_for(core, got[0], node), "session-action-waits",
                   f"elastic {got[0].spec.id} waits while {node.name} has idle CPU {node.free}")
            continue
        _check(not node.fits(got[0].spec.demand), "session-action-waits",
               f"{got[0].spec.id} ({got[0].spec.demand}) fits free {node.free} of {node.name}")


def instance_view(i: InstanceRecord) -> InstanceView:
    """A model instance as `Core.view` (and `Core.instance`) shows it."""
    return InstanceView(
        id=i.id, model=i.model.name, node=i.node, devices=i.devices,
        state="loading" if i.state is InstState.LOADING else ("busy" if i.batch else "ready"),
        queue=i.seqs(),
    )


def build_view(core: Core) -> CoreView:
    nodes = tuple(
        NodeView(
            name=n.name, pool=n.spec.pool, capacity=Resources(n.cap), used=Resources(n.used),
            free=Resources({k: max(0.0, v) for k, v in n.free.items()}),
            running=len(n.running), alive=n.alive, warm=dict(n.warm),
        )
        for n in core.st.nodes.values()
    )
    insts = tuple(instance_view(i)
                  for i in sorted(core.planner.instances.values(), key=lambda i: i.id))
    sessions = tuple(
        SessionView(id=s.id, node=s.node, demand=s.demand, actions=len(s.actions), last_active=s.last_active)
        for s in sorted(core.st.sessions.values(), key=lambda s: s.id)
    )
    queued: dict[str, int] = {}
    counts: dict[str, int] = {st.name: n for st, n in core.terminal.items()}
    for rec in core.st.actions.values():
        counts[rec.status.name] = counts.get(rec.status.name, 0) + 1
        if rec.status is S.QUEUED:
            k = rec.spec.kind.value
            queued[k] = queued.get(k, 0) + 1
    parked = {f"{n}/{m}": c for (n, m), c in core.planner.parked.items() if c > 0}
    return CoreView(time=core.st.now, policy=core.st.policy.name, nodes=nodes, instances=insts,
                    sessions=sessions, queued_by_kind=queued, counts=counts, parked=parked)
