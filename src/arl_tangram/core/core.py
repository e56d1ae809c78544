"""The scheduler core: ``handle(event) -> list[command]``, pure, no I/O and no clock of its own.

Invariants (checked by `Core.validate`, see `checks.py`):
- no alive node is ever allocated beyond its capacity in any dimension; what a node has in use is
  exactly the sum of the allotments, open sessions and model instances on it;
- every arrived action is in exactly one place (a queue, a node, a batch) until it gets exactly
  one `Deliver`, after which the core forgets it (bar a bounded history);
- a session's actions run only on its node; a model instance's devices lie in one NVLink domain;
- the scheduling pass is work-conserving: after each event no queued action of the shared pool
  fits on a node that is not reserved for an aged action.

`Core` keeps the event table and the handlers, the life of an action (arrival, admission, end,
delivery) and the history; everything else is a part that owns its state, each handed the
shared `state.CoreState` (records, nodes, the event in progress) and the parts below it:

    Queues (queues.py)        heaps, live counts, aging, FIFO floors, overdue times
    WarmPools (warmpools.py)  arrival rates, warm-pool targets
    Placer (placement.py)     node choice (fit.py), starts, reservations, warm executors
    Partitions (partitioning.py)  the static baselines' slices and pools
    Sessions (sessions.py)    where sessions open, those waiting, their TTLs
    Elastic (elastic.py)      elastic widths and placement, expansion, lending
    ModelPlanner (modelsched.py)  model instances, batches, scaling, eviction
    SchedulingPass (scheduling.py)  which queue heads are tried where after an event

A part never calls up: what needs the core (ending an action, another pass) comes back as a
return value. Every policy runs this same code; the causes commands carry are in `causes.py`,
the policies as data in `policies.py`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from . import events as ev
from .actions import ActionSpec, Elasticity, Status
from .build import make_arrived, make_deliver, make_result
from .causes import _CAUSE_FN, _cause_of
from .cluster import ClusterSpec, NodeSpec
from .commands import CallProvider, CancelAction, Command, WakeAt
from .config import POLICIES, CoreConfig
from .elastic import Elastic
from .estimator import DurationEstimator
from .lending import Lending
from .modelsched import ModelPlanner
from .partitioning import Partitions
from .placement import Placer
from .policies import Policy
from .providers import PROVIDER_KINDS, Providers, rank_of
from .queues import Queues
from .records import (
    ActionRecord,
    NodeState,
    SessionRecord,
    describe_story,
    is_session_key,
    model_key,
    partition_key,
    shape_key,
    tenant_shape_key,
)
from .resources import CPU, Resources
from .scheduling import SchedulingPass
from .sessionmem import SessionMemory
from .sessions import Sessions
from .state import CoreState, largest_capacity
from .view import CoreView, InstanceView
from .warmpools import WarmPools

__all__ = ["POLICIES", "Core", "CoreConfig"]

S = Status
_ACTIVE = (S.STARTING, S.RUNNING)
# The statuses the hot paths compare by identity, as module constants (read once, at import).
_QUEUED, _STARTING, _RUNNING = S.QUEUED, S.STARTING, S.RUNNING
_SUCCEEDED, _FAILED, _REJECTED = S.SUCCEEDED, S.FAILED, S.REJECTED
_ARRIVED, _FINISHED = ev.ActionArrived, ev.ActionFinished


class Core:
    """The scheduler state machine. Feed it events; execute the commands it returns."""

    # event type -> (handler, cause of the event): `handle`'s one lookup per event. Plain
    # functions at class level (filled below the class), not bound methods on the instance:
    # a core holds no reference cycle, so a dropped core is freed at once, not by a full
    # garbage collection that rescans everything it held.
    _dispatch: ClassVar[dict[type, tuple[Callable[[Any, Any], None], Callable[[Any], str]]]] = {}

    def __init__(self, cluster: ClusterSpec, config: CoreConfig | None = None) -> None:
        cfg = config or CoreConfig()
        self.st = st = CoreState(cluster, cfg)
        # delivered actions, newest last (at most `CoreConfig.history`): (int status, story), not
        # the record -- plain ints, floats and strings, which the garbage collector stops
        # tracking, so a long history does not make full collections come more often
        self.history: OrderedDict[str, tuple[int, tuple[object, ...]]] = OrderedDict()
        self.seq = 0
        self.arrived = 0
        self.delivered = 0
        self.terminal: dict[Status, int] = {}
        self.queues = Queues(st)
        self.warm = WarmPools(st)
        self.placer = Placer(st, self.queues)
        self.partitions = Partitions(st, self.placer, self.queues)
        self.sessions = Sessions(st, self.partitions)
        self.memory = SessionMemory(st, self.sessions)  # charges by measured use (`MemoryReport`)
        self.elastic = Elastic(st, self.queues, self.placer, self.warm)
        self.planner = ModelPlanner(st, self.queues)
        self.scheduling = SchedulingPass(st, self.queues, self.placer, self.elastic, self.partitions)
        # tenants' lent CPU taken back at once (time-slicing: lending.py); None without shares
        self.lending: Lending | None = None
        if st.fair and cfg.lend_floor < 1.0:
            self.lending = self.scheduling.lending = Lending(st, self.placer)
        for spec in cluster.nodes:
            self._add_node(spec)
        self._warm_pools = self.st.policy.warm_pools
        self._fixed_allotment = self.st.policy.fixed
        self._admit_by_use = self.st.policy.by_use and cfg.short_action_s > 0
        # estimator key -> CPU used over run time (cores) of its last finished actions, and
        # their mean (what `_charge` admits a short action by, with a margin)
        self._use_samples: dict[str, list[float]] = {}
        self._use_mean: dict[str, float] = {}
        # provider quotas (search/fetch/http actions wait here, not on a node: providers.py)
        self.providers = Providers(cfg.providers, cfg.aging_s, policy=cfg.provider_policy,
                                   semaphore=cfg.provider_semaphore, coalesce=cfg.provider_coalesce,
                                   trajectories=cfg.trajectories or 1)
        self._has_providers = bool(cfg.providers)
        if st.fair:  # (tenants' fair share of each provider's slots: providers.py)
            self.providers.tenant_weight = st.tenant_weight

    # ---- public ---------------------------------------------------------------------------------
    @property
    def estimator(self) -> DurationEstimator:
        return self.st.estimator

    @property
    def config(self) -> CoreConfig:
        return self.st.config

    @property
    def policy(self) -> Policy:
        return self.st.policy

    @property
    def actions(self) -> dict[str, ActionRecord]:
        """The live actions (read them, do not change them)."""
        return self.st.actions

    @property
    def nodes(self) -> dict[str, NodeState]:
        """The nodes as the core tracks them (read them, do not change them)."""
        return self.st.nodes

    def handle(self, event: ev.Event) -> list[Command]:
        """Apply one event; return the commands the driver must execute, in order."""
        t = type(event)
        handler: Callable[[Any, Any], None]
        if t is _FINISHED:  # the two frequent types: handler and `cause(event)` without lookups
            handler = _ON_FINISHED
            cause_s = f"ActionFinished:{event.action_id}"  # type: ignore[attr-defined]
        elif t is _ARRIVED:
            handler = _ON_ARRIVED
            cause_s = f"ActionArrived:{event.action.id}"  # type: ignore[attr-defined]
        else:
            got = self._dispatch.get(t)
            if got is None:
                raise TypeError(f"Core.handle: unknown event type {type(event).__name__}")
            handler, cause = got
            cause_s = cause(event)
        out = self.st.begin(event.time, cause_s)
        self._before_event()
        handler(self, event)
        self._after_event()
        self.st.end()
        return out

    # ---- the phases of an event -----------------------------------------------------------------
    # `handle` = look up the handler, `_before_event`, the handler, `_after_event`. The order of
    # the phases in `_after_event` is the algorithm: each may leave work for the next (a session
    # closed by its TTL frees capacity for the pass; an aged action's queue is looked at by it;
    # the pass runs before expansion so that queued work takes what freed up first).
    def _before_event(self) -> None:
        """Boot (the first event), and park the aging entries an event that raised left."""
        planner = self.planner
        if not planner.booted:
            self.warm.boot()
            planner.boot()
        if self.queues.aging_new:
            self.queues.park_aging()

    def _after_event(self) -> None:
        """The post-event phases, in order (docs/core.md, "The phases of an event")."""
        now = self.st.now
        lending = self.lending
        if lending is not None and lending.holds:
            lending.expire(now)  # (anticipation: holds past their window go back first)
        self._expire_phase(now)
        self.queues.age_until(now)
        self._wake_overdue_phase(now)
        self._pass_phase()
        self._models_phase()
        self._yield_devices_phase()
        self._expand_phase()
        self._flush_phase()

    def _expire_phase(self, now: float) -> None:
        """expire: sessions past their TTL close (their capacity is free for the pass)."""
        expiry = self.sessions.expiry
        if expiry and expiry[0][0] <= now:
            self._expire_sessions()

    def _wake_overdue_phase(self, now: float) -> None:
        """wake overdue: queued elastic actions that waited their expected run mark their queues."""
        overdue = self.queues.overdue_heap
        if overdue and overdue[0][0] <= now:
            self.queues.wake_overdue()

    def _pass_phase(self) -> None:
        """pass: with capacity freed, a queue head changed or partitions stale, the scheduling
        pass; then once more for those a warm pool that ran dry in it left waiting."""
        st = self.st
        placer = self.placer
        if placer.rewake:
            st.touched.update(placer.woken())
        if st.dirty or st.touched or (self.partitions.stale and st.partitioned):
            lending = self.lending
            if lending is not None and lending.squeezed and st.dirty:
                lending.regrow(st.dirty)  # (squeezed actions first, then the pass)
            self._schedule()  # (with none of them set, the pass has nothing to look at)
            if placer.rewake:
                self.scheduling.run_pass(placer.woken(), None, -1.0)

    def _models_phase(self) -> None:
        """models: models whose queue or instances changed form batches and scale."""
        if self.st.models_touched:
            self.planner.dispatch()

    def _yield_devices_phase(self) -> None:
        """yield devices: idle model instances evicted for queued GPU actions, then a pass."""
        planner = self.planner
        if (planner.instances and self.queues.shape_keys and planner.dynamic
                and planner.yield_devices()):
            self._schedule()

    def _expand_phase(self) -> None:
        """expand: elastic actions widen into what is still free (after the pass: queued work
        took what freed up first)."""
        st = self.st
        if st.elastic_policy and (st.dirty or st.expand_at):
            self.elastic.expand()

    def _flush_phase(self) -> None:
        """flush: the event's change sets cleared, its aging entries parked, providers pumped
        (timeouts, sends, the next wake), the free index brought up to date."""
        st = self.st
        lending = self.lending
        # (`at >= 0` against `> 0`: `at` is 0 only where the take-back's start is the event's
        # first command; a stale 0 puts the next event's lowered quotas first in its commands,
        # still before its start -- docs/testing.md, "Lending, left")
        if lending is not None and (lending.changed or lending.wake
                                    or lending.at >= 0):  # pragma: no mutate (above)
            lending.emit()
        if st.dirty:
            st.dirty.clear()
        if st.touched:
            parked = st.parked
            to_stream = self.queues.to_stream
            for key in st.touched:  # a session queue's head may have changed: onto its node's
                if is_session_key(key):  # stream (`HeadStream`), a parked session unparked
                    if parked:  # (its queue changed: its node's passes look again)
                        st.unpark(key[1])
                    to_stream(key[1])
            st.touched.clear()
        if self.queues.aging_new:
            self.queues.park_aging()
        if self._has_providers:
            self._pump_providers()
        st.index.flush()

    def provider_stats(self) -> dict[str, dict[str, Any]]:
        return self.providers.stats()

    def status(self, action_id: str) -> Status | None:
        rec = self.st.actions.get(action_id)
        if rec is not None:
            return rec.status
        done = self.history.get(action_id)
        return Status(done[0]) if done is not None else None

    def story(self, action_id: str) -> list[str]:
        rec = self.st.actions.get(action_id)
        if rec is not None:
            return rec.describe()
        done = self.history.get(action_id)
        return describe_story(done[1]) if done is not None else []

    def view(self) -> CoreView:
        from .checks import build_view

        return build_view(self)

    def instance(self, instance_id: str) -> InstanceView | None:
        """One model instance as `view` shows it (None: the core holds none of that id)."""
        from .checks import instance_view

        got = self.planner.instances.get(instance_id)
        return instance_view(got) if got is not None else None

    def instances_of(self, model: str) -> list[InstanceView]:
        """The instances of ``model`` the core holds (loading, ready or busy), by id."""
        from .checks import instance_view

        insts = self.planner.instances
        return [instance_view(insts[i]) for i in sorted(self.planner.by_model.get(model, ()))]

    def validate(self) -> None:
        from .checks import validate

        validate(self)

    # ---- actions --------------------------------------------------------------------------------
    def _on_arrived(self, e: ev.ActionArrived) -> None:
        spec = e.action
        old = self.st.actions.get(spec.id)
        if old is not None:
            old.note(e.time, "duplicate arrival ignored", spec.id)
            return
        self.history.pop(spec.id, None)
        if self._fixed_allotment:
            spec = self._at_fixed(spec)
        self.seq += 1
        self.arrived += 1
        rec = ActionRecord(spec, e.time, self.seq)
        self.st.actions[spec.id] = rec
        rec.note(e.time, "arrived", spec.id)
        if spec.kind in PROVIDER_KINDS:
            self._provider_arrived(rec)
            return
        reason = self._impossible(rec)
        if reason:
            rec.move(S.REJECTED, e.time, spec.id)
            self._deliver(rec, S.REJECTED, reason=reason)
            return
        est = self.st.estimator
        rec.ekey, rec.units = ekey, units = est.work_of(spec)
        rec.est = est.predict_work(ekey, units, self.st.config.estimate_quantile)
        if self.st.partitioned and not rec.is_model:
            rec.partition = self.partitions.partition_for(spec)
        if spec.session is not None and not rec.is_model:
            self.sessions.attach(rec)
        self.elastic.arrived(rec.cpu)
        if self._admit_by_use and rec.est <= self.st.config.short_action_s:
            self._charge(rec)
        if self.st.fair:  # its tenant's own queues (`tenant_shape_key`): the pass picks the tenant first
            rec.tenant = tenant = spec.tenant or ""
            if tenant:
                rec.skey = tenant_shape_key(rec.skey, tenant)
        if self._warm_pools and spec.session is None and not rec.is_model:
            self.warm.arrived(rec.wkey)
        if rec.is_model and spec.model is not None:
            self.planner.note_arrival(spec.model, e.time)
        rec.move(_QUEUED, e.time, spec.id)
        self.queues.enqueue(rec)

    def _at_fixed(self, spec: ActionSpec) -> ActionSpec:
        """static-pool: an elastic action as a rigid one at the fixed allotment ``static_k``
        (clamped to its range and to the largest node), the speed of that allotment kept."""
        el = spec.elasticity
        if el is None or not el.is_elastic or spec.kind.uses_model:
            return spec
        k = self.st.config.static_k
        k = el.max if k is None else min(max(k, el.min), el.max)
        largest = self.st.largest().get(el.dim, 0.0)
        if largest > 0.0:
            k = max(el.min, min(k, largest))
        k = float(k)  # (the same repr compiled and pure: annotated floats are floats compiled)
        fixed = Elasticity(k, k, el.dim, el.speedup)
        return replace(spec, demand=spec.demand.with_amount(el.dim, k), elasticity=fixed)

    def _schedule(self) -> None:
        """The scheduling pass, once partitions are up to date and sessions that waited for
        room have looked again (where a node's capacity moved, or a waiting session lost an
        action: `Sessions.lost`)."""
        if self.partitions.stale and self.st.partitioned:
            self.partitions.compute()
        sessions = self.sessions
        if sessions.pending and (self.st.dirty or sessions.shrunk):
            sessions.open_pending()
        self.scheduling.schedule()

    def _on_batch_arrived(self, e: ev.ActionsArrived) -> None:
        for spec in e.actions:
            self.st.recause(f"ActionArrived:{spec.id}")
            self._on_arrived(make_arrived(e.time, spec))

    def _charge(self, rec: ActionRecord) -> None:
        """Admit a short, rigid one-shot CPU action by the CPU its kind was measured to use
        (`CoreConfig.short_action_s`; the mean of the last 32, x1.25): its node is charged
        that, rounded up to its demand over a power of two (few
        shapes, few queues); its StartAction's allotment (the cgroup quota) stays its demand."""
        spec = rec.spec
        if spec.elasticity is not None or spec.session is not None or rec.is_model or rec.cpu <= 0:
            return
        use = self._use_mean.get(rec.ekey[0])
        if use is None:
            return
        # the demand over a power of two (1/2, 1/4, 1/8 of it): few shapes, and a mean that
        # drifts a little moves no action to another queue
        frac = max(0.125, use * 1.25 / rec.cpu)
        c = rec.cpu * 2.0 ** math.ceil(math.log2(frac) - 1e-9) if frac < 1.0 else rec.cpu
        if c >= rec.cpu - 1e-9:
            return
        charge = spec.demand.with_amount(CPU, c)
        rec.charge = charge
        rec.skey = skey = shape_key(charge._d)
        rec.shape = skey.shape
        rec.cpu = c

    def _learn_use(self, key: str, cores: float) -> None:
        """Note the CPU (in cores) an action of estimator key ``key`` used while it ran."""
        got = self._use_samples.get(key)
        if got is None:
            got = self._use_samples[key] = []
        got.append(cores)
        if len(got) > 32:
            del got[0]
        if len(got) >= 4:
            self._use_mean[key] = sum(got) / len(got)

    def _on_started(self, e: ev.ActionStarted) -> None:
        rec = self.st.actions.get(e.action_id)
        if rec is None or rec.status is not _STARTING:
            return
        rec.move(_RUNNING, e.time, self.st.cause)
        rec.start_time = e.time
        if e.cold_start_s:
            rec.note(e.time, f"cold start {e.cold_start_s:.3g}s", self.st.cause)

    def _on_finished(self, e: ev.ActionFinished) -> None:
        if self._has_providers and e.action_id in self.providers.owner:
            self._provider_finished(e)
            return
        rec = self.st.actions.get(e.action_id)
        if rec is None or rec.status not in _ACTIVE or rec.batch is not None:
            return  # stale (cancelled, requeued, or unknown): ignored
        es = e.status
        finished = es.is_finished
        status = es if finished and es is not _REJECTED else _FAILED
        run_s = e.run_s
        if run_s is None and rec.start_time is not None:
            run_s = e.time - rec.start_time
        if status is _SUCCEEDED and run_s is not None and rec.allotment is not None:
            spec = rec.spec
            quota = rec.allotment if rec.charge is None else spec.demand  # (what it ran with)
            speed = spec.speed(quota)  # (< 1 for a rigid action on a fractional slice)
            self.st.estimator.observe_work(rec.ekey, rec.units, run_s, speed)
            self.st.estimator.note_error(rec.ekey, rec.est, run_s * speed)
            if e.cpu_s is not None and run_s > 0.0 and self._admit_by_use:
                self._learn_use(rec.ekey[0], e.cpu_s / run_s)
        reason = e.reason
        if status is _FAILED and not reason and not finished:
            reason = f"executor reported non-terminal status {e.status.name}"
        self._end(rec, status, e.output, reason)

    def _on_cancel(self, e: ev.CancelRequested) -> None:
        rec = self.st.actions.get(e.action_id)
        if rec is None:
            return
        if rec.status in _ACTIVE and rec.batch is None and rec.node is not None:
            self.st.out.append(CancelAction(rec.spec.id, rec.node, cause=self.st.cause))
        elif self._has_providers and rec.status in _ACTIVE and rec.spec.id in self.providers.owner:
            # a provider call in flight: abort it (on no node); its slot is freed by the report
            self.st.out.append(CancelAction(rec.spec.id, "", cause=self.st.cause))
        self._end(rec, S.CANCELLED, reason="cancelled by request")

    def _end(self, rec: ActionRecord, status: Status, output: Any = None, reason: str = "") -> None:
        """Move a live action to a terminal status, release what it holds, deliver it."""
        if self._has_providers and self.providers.holds(rec.spec.id):
            self._provider_end(rec, status, output, reason)
            return
        st = rec.status
        if st is _QUEUED:
            self.queues.dequeue(rec)
        elif rec.allotment is not None and rec.batch is None and (st is _RUNNING or st is _STARTING):
            self._release(rec)
        rec.batch = None
        sid = rec.spec.session
        if sid is not None:
            sess = self.st.sessions.get(sid)
            if sess is not None:
                sess.actions.discard(rec.spec.id)
                sess.last_active = self.st.now
                if sess.node is None:
                    self.sessions.lost(sess)
        rec.move(status, self.st.now, self.st.cause)
        self._deliver(rec, status, output, reason)

    def _deliver(self, rec: ActionRecord, status: Status, output: Any = None, reason: str = "") -> None:
        """Deliver a finished action (ActionResult in a Deliver, built field by field: build.py)
        and forget it, bar the history."""
        aid = rec.spec.id
        res = make_result(aid, status, rec.submit_time, rec.start_time, self.st.now, rec.node,
                          rec.allotment if rec.charge is None else rec.spec.demand, output, reason,
                          rec.attempts)
        self.st.out.append(make_deliver(res, self.st.cause))
        self.delivered += 1
        term = self.terminal
        term[status] = term.get(status, 0) + 1
        del self.st.actions[aid]
        hist = self.history
        hist[aid] = (status._value_, rec.story)
        if len(hist) > self.st.config.history:
            hist.popitem(last=False)

    def _release(self, rec: ActionRecord) -> None:
        """Give an active action's allotment back to its node."""
        node = self.st.nodes.get(rec.node or "")
        alloc = rec.allotment
        aid = rec.spec.id
        if node is None or alloc is None or aid not in node.running:
            return
        node.running.discard(aid)
        if rec.elastic:
            node.elastic.pop(aid, None)
            node.lent.pop(aid, None)
            rec.lent_on = None
        lending = self.lending
        held = lending is not None and lending.released(rec)
        node.give(alloc)
        if held:  # (anticipation: what it frees may stay its tenant's a while)
            assert lending is not None
            lending.hold(rec, node)
        if self.st.fair:
            self.st.tenant_take(rec.tenant, alloc._d, -1.0)
        if rec.partition is not None:
            freed = self.partitions.release(rec)
            if freed is not None:  # its partition's queues, and its session queues, look again
                p, name = freed
                st = self.st
                st.dirty.add(name)
                st.touched.add(partition_key(p))
                keys = self.queues.session_queues_of(p)
                if keys:
                    st.touched.update(keys)
        if node.alive:  # (held: the pass that follows usually fills the node again)
            self.st.index.hold(node.name, node.free)
            self.st.dirty.add(node.name)

    def _requeue_or_lose(self, rec: ActionRecord, reason: str) -> None:
        """After a node loss: idempotent, session-free actions run again; the others are lost."""
        if rec.spec.idempotent and rec.spec.session is None:
            if rec.batch is None:
                self._release(rec)
            rec.batch = None
            rec.move(S.QUEUED, self.st.now, self.st.cause)
            rec.note(self.st.now, f"requeued: {reason}", self.st.cause)
            self.queues.enqueue(rec)
        else:
            self._end(rec, S.NODE_LOST, reason=reason)

    # ---- sessions -------------------------------------------------------------------------------
    def _close_session(self, sess: SessionRecord, reason: str, *, lost: bool = False,
                       evicted: bool = False) -> None:
        """Close a session; its queued actions are cancelled (all its actions lost, ``lost``;
        failed, ``evicted``)."""
        status = S.NODE_LOST if lost else S.FAILED if evicted else S.CANCELLED
        aids, grew = self.sessions.close(sess, reason, lost, evicted)
        if grew is not None:  # its charge came back: the pass looks at the node
            self.st.dirty.add(grew)
        for aid in aids:
            rec = self.st.actions.get(aid)
            if rec is not None and (rec.status is S.QUEUED or lost):
                self._end(rec, status, reason=f"session {sess.id} closed: {reason}")

    def _on_session_requested(self, e: ev.SessionRequested) -> None:
        if self.memory.evicted:
            self.memory.evicted.pop(e.session_id, None)  # (the id opened again)
        self.sessions.request(e)

    def _on_memory_report(self, e: ev.MemoryReport) -> None:
        grew, evict = self.memory.report(e)
        if grew is not None:  # charges fell there: the pass looks at the node
            self.st.dirty.add(grew)
        for sess, reason in evict:
            self._close_session(sess, reason, evicted=True)

    def _on_session_closed(self, e: ev.SessionClosed) -> None:
        sess = self.st.sessions.get(e.session_id)
        if sess is not None:
            self._close_session(sess, e.reason or "closed by client")

    def _expire_sessions(self) -> None:
        for sess in self.sessions.expired():
            self._close_session(sess, "ttl expired")

    # ---- nodes ----------------------------------------------------------------------------------
    def _add_node(self, spec: NodeSpec) -> NodeState:
        node = NodeState(spec)
        self.st.nodes[spec.name] = node
        self.st.index.update(spec.name, node.free)
        self.st.dirty.add(spec.name)
        self._node_changed()
        return node

    def _node_changed(self) -> None:
        """A node came or went: what was derived from the set of nodes is recomputed."""
        self.st.capacity_changed()
        self.warm.nodes_changed()
        self.partitions.nodes_changed()

    def _on_node_added(self, e: ev.NodeAdded) -> None:
        old = self.st.nodes.get(e.node.name)
        if old is not None and old.alive:
            return
        self._add_node(e.node)
        if self.planner.booted:
            self.planner.provision(e.node.name)
        self.sessions.open_pending()

    def _on_node_lost(self, e: ev.NodeLost) -> None:
        node = self.st.nodes.get(e.node)
        if node is None or not node.alive:
            return
        node.alive = False
        self.st.index.remove(node.name)
        if self.lending is not None:
            self.lending.holds.pop(node.name, None)  # (a hold there is gone with it)
        for key in list(node.warm):
            self.placer.set_warm(node, key, 0)
        reason = f"node {node.name} lost: {e.reason}"
        for aid in sorted(node.running):
            rec = self.st.actions.get(aid)
            if rec is not None:
                self._requeue_or_lose(rec, reason)
        for rec in self.planner.lose_instances(node):
            self._requeue_or_lose(rec, reason)
        for sid in sorted(node.sessions):
            sess = self.st.sessions.get(sid)
            if sess is not None:
                self._close_session(sess, reason, lost=True)
        node.running.clear()
        node.elastic.clear()
        node.lent.clear()
        self._node_changed()

    # ---- models ---------------------------------------------------------------------------------
    def _on_model_loaded(self, e: ev.ModelLoaded) -> None:
        failed = self.planner.loaded(e)
        if failed is not None:  # its queue fails: no instance of it could load
            name, reason = failed
            key = model_key(name)
            while (got := self.queues.head(key)) is not None:
                self._end(got[0], S.FAILED, reason=reason)
            self.planner.failures_reset(name)

    def _on_model_unloaded(self, e: ev.ModelUnloaded) -> None:
        lost, given_up, why = self.planner.unloaded(e)
        if lost:
            self._requeue_batch(lost, e)
        if given_up:  # its instances keep dying: its queue fails, the next arrival loads again
            key = model_key(given_up)
            while (got := self.queues.head(key)) is not None:
                self._end(got[0], S.FAILED, reason=why)

    def _requeue_batch(self, lost: list[ActionRecord], e: ev.ModelUnloaded) -> None:
        reason = e.reason or f"model instance {e.instance_id} was unloaded mid-batch"
        retries = self.st.config.model_worker_retries
        for rec in lost:  # its batch produced no score: run it again (bounded), or fail it
            if rec.attempts <= retries and rec.spec.idempotent:
                rec.batch = None
                rec.move(S.QUEUED, self.st.now, self.st.cause)
                rec.note(self.st.now, f"requeued: {reason}", self.st.cause)
                self.queues.enqueue(rec)
            else:
                self._end(rec, S.FAILED, reason=f"{reason} (tried {rec.attempts} times)")

    def _on_batch_finished(self, e: ev.BatchFinished) -> None:
        bid = e.batch_id
        for aid in self.planner.batch_finished(e):
            rec = self.st.actions.get(aid)
            if rec is None or rec.batch != bid:
                continue  # cancelled or requeued meanwhile
            if aid in e.failed:
                self._end(rec, S.FAILED, reason=e.failed[aid])
            elif aid in e.outputs:
                self._end(rec, S.SUCCEEDED, output=e.outputs[aid])
            else:
                self._end(rec, S.FAILED, reason=f"no result for it in batch {bid}")

    def _on_warm_report(self, e: ev.WarmPoolReport) -> None:
        node = self.st.nodes.get(e.node)
        if node is None or not node.alive:
            return
        self.placer.set_warm(node, e.key, e.warm)

    def _on_tick(self, e: ev.Tick) -> None:
        self.planner.scale_in()
        if self.st.policy.warm_pools:
            self.warm.targets()

    # ---- providers (providers.py) ---------------------------------------------------------------
    def _provider_arrived(self, rec: ActionRecord) -> None:
        """A search/fetch/http action: it waits for its provider's token and slot (or joins an
        identical call: ``payload["coalesce"]``), or fails at once (unknown provider: rejected;
        budget spent: failed)."""
        spec = rec.spec
        now = self.st.now
        name = spec.tag or ""
        if name not in self.providers.by_name:
            known = ", ".join(sorted(self.providers.by_name)) or "none declared"
            rec.move(S.REJECTED, now, spec.id)
            self._deliver(rec, S.REJECTED, reason=f"unknown provider {name!r} (providers: {known})")
            return
        est = self.st.estimator
        rec.ekey, rec.units = ekey, units = est.work_of(spec)
        rec.est = est.predict_work(ekey, units, self.st.config.estimate_quantile)
        got = spec.payload.get("coalesce") if spec.payload else None
        key = got if isinstance(got, str) and got else None
        rec.move(_QUEUED, now, spec.id)
        hit = spec.payload.get("cached") if spec.payload else None
        if hit is not None:  # the front door's cache answered it: no token, no slot, no call
            self.providers.by_name[name].cache_hits += 1
            rec.move(_SUCCEEDED, now, spec.id)
            self._deliver(rec, _SUCCEEDED, hit)
            return
        step = spec.payload.get("step") if spec.payload else None  # (an RL step: its budget)
        why = self.providers.arrive(spec.id, name, key, rank_of(rec.est, spec.weight), rec.seq,
                                    now, rec.submit_time + spec.timeout_s, spec.trajectory,
                                    step if type(step) is int else None,
                                    (spec.tenant or "") if self.st.fair else None)
        if why:
            rec.move(_FAILED, now, spec.id)
            self._deliver(rec, _FAILED, reason=why)
        elif spec.id in self.providers.follows:
            rec.note(now, f"coalesced with {self.providers.follows[spec.id]}", spec.id)

    def _pump_providers(self) -> None:
        """After every event: time out and fail what must, send what may, and ask to be woken
        when the next token appears."""
        prov = self.providers
        st = self.st
        now = st.now
        if prov.timers and prov.timers[0][0] <= now + 1e-9:
            for aid, why in prov.due(now):
                rec = st.actions.get(aid)
                if rec is not None:
                    self._end(rec, S.TIMED_OUT, reason=why)
        for aid, why in prov.exhausted(now):
            rec = st.actions.get(aid)
            if rec is not None:
                self._end(rec, _FAILED, reason=why)
        for d in prov.ready(now):
            rec = st.actions[d.action_id]
            rec.attempts += 1
            rec.move(_STARTING, now, st.cause)
            if rec.start_time is None:
                rec.start_time = now
            st.out.append(CallProvider(rec.spec, d.provider, rec.attempts,
                                       rec.submit_time + rec.spec.timeout_s, st.cause))
        wake = prov.next_wake(now)
        if now < wake < math.inf and (prov.wake_sent <= now or wake < prov.wake_sent - 1e-9):
            prov.wake_sent = wake
            st.out.append(WakeAt(wake, st.cause))

    def _provider_finished(self, e: ev.ActionFinished) -> None:
        """A provider call came back (not a 429): its slot is free; a success raises the rate
        (additive increase) and teaches the estimator."""
        aid = e.action_id
        rec = self.st.actions.get(aid)
        ok = e.status is _SUCCEEDED
        self.providers.finished(aid, self.st.now, ok)
        if rec is None or rec.status not in _ACTIVE:
            return  # (ended meanwhile: only its slot was held)
        run_s = e.run_s
        if run_s is None and rec.start_time is not None:
            run_s = e.time - rec.start_time
        if ok and run_s is not None:
            self.st.estimator.observe_work(rec.ekey, rec.units, run_s, 1.0)
            self.st.estimator.note_error(rec.ekey, rec.est, run_s)
        status = e.status if e.status.is_finished and e.status is not _REJECTED else _FAILED
        self._provider_end(rec, status, e.output, e.reason)

    def _on_provider_throttled(self, e: ev.ProviderThrottled) -> None:
        """A 429: the provider's bucket is lowered (or paused: Retry-After) and the call waits
        again in its old place, failing past the provider's ``max_attempts``."""
        aid = e.action_id
        now = self.st.now
        prov = self.providers.throttled(aid, now, e.retry_after_s)
        if prov is None:
            return
        rec = self.st.actions.get(aid)
        if rec is None or rec.status not in _ACTIVE:
            self.providers.owner.pop(aid, None)
            return
        name = prov.limits.name
        if not self.providers.retry_429:  # (the semaphore baseline: verl does not retry a 429)
            self._end(rec, _FAILED, reason=f"provider {name!r}: HTTP 429 (not retried)")
            return
        if rec.attempts >= prov.limits.max_attempts:
            self._end(rec, _FAILED, reason=f"provider {name!r}: answered 429 to {rec.attempts} "
                                           f"attempts{': ' + e.reason if e.reason else ''}")
            return
        rec.move(_QUEUED, now, self.st.cause)
        after = "" if e.retry_after_s is None else f", Retry-After {e.retry_after_s:g}s"
        rec.note(now, f"throttled by {name} (429{after}): waits again", self.st.cause)
        spec = rec.spec
        self.providers.requeue(aid, rank_of(rec.est, spec.weight), rec.seq, now,
                               rec.submit_time + spec.timeout_s)

    def _on_wake(self, e: ev.Wake) -> None:
        """A `WakeAt` came due: `_pump_providers` (after every event) does the rest."""

    def _provider_end(self, rec: ActionRecord, status: Status, output: Any, reason: str) -> None:
        """End a provider action (waiting, in flight or a follower) and give its outcome to its
        followers; a cancelled leader hands the call to its first follower instead."""
        prov = self.providers
        aid = rec.spec.id
        key = prov.key_of.get(aid)
        prov.forget(aid)
        rec.move(status, self.st.now, self.st.cause)
        self._deliver(rec, status, output, reason)
        followers = prov.take_followers(aid)
        if not followers:
            return
        if status is S.CANCELLED and key is not None:
            first = self.st.actions[followers[0]]
            prov.promote(first.spec.id, key[0], key[1], followers[1:])
            first.note(self.st.now, f"leads the call after {aid} was cancelled", self.st.cause)
            prov.enqueue(prov.by_name[key[0]], first.spec.id, rank_of(first.est, first.spec.weight),
                         first.seq, self.st.now, first.submit_time + first.spec.timeout_s,
                         (first.spec.tenant or "") if self.st.fair else None)
            return
        for fid in followers:
            frec = self.st.actions.get(fid)
            if frec is not None:
                frec.move(status, self.st.now, self.st.cause)
                self._deliver(frec, status, output, reason)

    # ---- admission ------------------------------------------------------------------------------
    def _impossible(self, rec: ActionRecord) -> str:
        """Why no node could ever run the action (even empty), or '' when some could."""
        spec = rec.spec
        if rec.is_model:
            return self.planner.impossible(spec)
        demand = spec.demand
        if spec.session is not None and self.memory.evicted and spec.session not in self.st.sessions:
            gone = self.memory.evicted.get(spec.session)
            if gone:
                return gone
        if spec.session is None and not self.st.policy.partitioned:
            return "" if self.st.fits_some_node(demand, rec.skey) else self._too_big(demand)
        if self.st.policy.partitioned and spec.session is None:
            demand = demand.with_amount("cpu", 0.0)  # partitions run it at their CPU quota
        sid = spec.session
        sess = self.st.sessions.get(sid) if sid is not None else None
        if sess is not None and sess.node is not None:
            node = self.st.nodes[sess.node]
            cap, held = node.cap, sess.demand._d
            for k, v in demand._d.items():  # `demand.fits_in(Resources(cap) - held)`, unallocated
                r = cap.get(k, 0.0) - held.get(k, 0.0)
                if v > (r if r > 1e-9 else 0.0) + 1e-9:
                    room = Resources(cap) - sess.demand
                    short = demand.shortfall(room)
                    return f"demand {demand} exceeds what session {sid}'s node {node.name} can offer: short {short}"
            return ""
        if sid is not None and sess is None:
            demand = demand + self.st.config.session_demand
        if not self.st.fits_some_node(demand, tuple(sorted(demand._d.items()))):
            return self._too_big(demand)
        return ""

    def _too_big(self, demand: Resources) -> str:
        return f"no node can ever satisfy demand {demand} (largest capacities {largest_capacity(self.st.nodes.values())})"


# (`handle`'s shortcut for the two frequent types)
_ON_ARRIVED: Callable[[Any, Any], None] = Core._on_arrived
_ON_FINISHED: Callable[[Any, Any], None] = Core._on_finished
Core._dispatch.update({
    t: (h, _CAUSE_FN.get(t, _cause_of))
    for t, h in (
        (ev.ActionArrived, Core._on_arrived),
        (ev.ActionsArrived, Core._on_batch_arrived),
        (ev.ActionStarted, Core._on_started),
        (ev.ActionFinished, Core._on_finished),
        (ev.CancelRequested, Core._on_cancel),
        (ev.SessionRequested, Core._on_session_requested),
        (ev.SessionClosed, Core._on_session_closed),
        (ev.MemoryReport, Core._on_memory_report),
        (ev.NodeAdded, Core._on_node_added),
        (ev.NodeLost, Core._on_node_lost),
        (ev.ModelLoaded, Core._on_model_loaded),
        (ev.ModelUnloaded, Core._on_model_unloaded),
        (ev.BatchFinished, Core._on_batch_finished),
        (ev.WarmPoolReport, Core._on_warm_report),
        (ev.Tick, Core._on_tick),
        (ev.ProviderThrottled, Core._on_provider_throttled),
        (ev.Wake, Core._on_wake),
    )
})
