"""Reward models and judges: instances, batching, routing, scaling, swap-in, failures.

Invariant: every model instance holds whole devices of one node inside one NVLink domain
(chosen by `topology.choose_devices`), at most one batch is in flight per instance, and an
idle READY instance never coexists with queued actions of its model after a pass (unless the
batch is deliberately held: to fill, ``max_batch_wait_s``, or to spread the starts, `staggered`).

Continuous batching (``ModelSpec.max_seqs > 0``: an inference engine, kind genjudge): an instance
runs several batches at once, up to ``max_seqs`` actions in flight (``InstanceRecord.more``
beside ``batch``), and a READY instance with a free sequence never coexists with queued actions
of its model after a pass: queued actions start at once as a batch of up to the free sequences
(``max_batch`` at most), never held to fill a knee or spread starts, since the engine admits
them into the batch it is running.

Actions of a model wait in one queue per model; an instance that is ready and idle takes the
next batch, up to the knee of the model's latency curve (`ModelSpec.knee_batch`), so routing
goes to the instance with the least wait. Dynamic policies (tangram, fifo) load
``model_min_instances`` of each model at the first event and, with ``model_prewarm``, fill the
free devices round-robin as static provisioning does (idle devices serve no one; a loaded
instance answers the first burst without a load). They scale out while the expected queue
wait exceeds the cost of a new instance (a swap-in from parked host weights when there are
some, else a cold load), or while the backlog exceeds what loading instances will take plus
``scale_out_batches`` knee batches per ready one -- onto free devices, else by parking idle
instances of other models (lazy eviction, victims by least expected loss: models with more
replicas and older use first, a model's last instance only for a model that has none). A
GPU action of the shared pool that is blocked only by idle instances gets their devices the
same way. Idle instances are parked for idleness alone only after ``model_idle_s`` (default
never). Static policies load a fixed set up front (round-robin over the models until the
devices or ``max_instances`` run out) and never scale.

Batch starts are spread (`staggered`), under every policy: a batch takes at least ``alpha``,
and an action that arrives while every instance is busy waits for the first to finish.
Instances that start together finish together and leave the next arrivals a long wait;
instances whose starts lie ``alpha / n`` apart leave at most that. So an idle instance holds a
batch below the knee until ``alpha / n`` after the model's last start (``n`` ready instances),
where the model's arrivals come at least once per that gap (a later arrival or Tick releases
the hold); a full batch, a single instance or sparse arrivals start at once. This is bound (c)
of `sim/bounds.py` turned into a rule: at most ``n`` starts per ``alpha``, spread as evenly as
the arrivals allow.
"""

from __future__ import annotations

import math
from collections import deque

from .actions import ActionSpec, Status
from .cluster import ModelSpec
from .commands import LoadModel, RunBatch, UnloadModel
from .events import BatchFinished, ModelLoaded, ModelUnloaded
from .queues import Queues
from .records import ActionRecord, InstanceRecord, InstState, NodeState, model_key
from .state import CoreState
from .topology import can_ever_place, choose_devices, place_on_nodes

S = Status
PREFIXES = 65536  # trajectories whose last judge-engine instance is remembered (`route`)


class ModelPlanner:
    """Model instances and their batches: loading, routing, scaling, eviction, failures."""

    def __init__(self, st: CoreState, queues: Queues) -> None:
        self.st = st
        self.queues = queues
        self.dynamic = st.policy.dynamic_models
        self.instances: dict[str, InstanceRecord] = {}
        self.by_model: dict[str, set[str]] = {m: set() for m in st.models}  # model -> instances
        self.parked: dict[tuple[str, str], int] = {}  # (node, model) -> weights parked in host memory
        self.unparking: dict[str, tuple[str, str]] = {}  # unloaded iid -> (node, model) parked
        self.load_failures: dict[str, int] = {}  # model -> failed loads in a row
        self.worker_deaths: dict[str, int] = {}  # model -> instance deaths since its last score
        self.static_target: dict[str, int] = {}  # static policies: model -> instances it keeps
        self.batches: dict[str, tuple[str, tuple[str, ...]]] = {}  # batch -> (instance, actions)
        self.needs_gpu: dict[object, bool] = {}  # shared-pool queue key -> demands a GPU
        self.booted = False  # the first event provisioned the models (`boot`)
        self.instance_seq = 0
        self.batch_seq = 0
        self.arrivals: dict[str, deque[float]] = {}  # model -> its arrival times in the window
        self.last_start: dict[str, float] = {}  # model -> when its last batch started
        # judge engines (`route`): trajectory -> (instance that served its last request, that
        # request's prompt tokens: the prefix its cache holds), oldest first, at most PREFIXES
        self.prefix: dict[str, tuple[str, int]] = {}
        self.rr: dict[str, int] = {}  # model -> round-robin position (engine_routing round-robin)

    # ---- admission ------------------------------------------------------------------------------
    def impossible(self, spec: ActionSpec) -> str:
        m = self.st.models.get(spec.model or "")
        if m is None:
            return f"model {spec.model!r} is not in the cluster spec"
        key = model_key(m.name)
        if key not in self.st.fits_some:
            why = place_on_nodes([n.spec for n in self.st.nodes.values() if n.alive], m)
            self.st.fits_some[key] = not why
            if why:
                return why
        if not self.st.fits_some[key]:
            return place_on_nodes([n.spec for n in self.st.nodes.values() if n.alive], m) or "no node"
        if not self.dynamic and self.static_target.get(m.name, 0) == 0:
            return f"static provisioning has no instance of model {m.name} (no devices left for it)"
        return ""

    # ---- placement of instances -----------------------------------------------------------------
    def pick_devices(self, m: ModelSpec, only: str | None = None) -> tuple[NodeState, tuple[int, ...], bool] | None:
        """Where a new instance of ``m`` goes: a node with its parked weights first, else the
        node with the fewest free devices that still fits it (packing)."""
        best: tuple[tuple[int, int, str], NodeState, tuple[int, ...], bool] | None = None
        for node in self.st.nodes.values():
            if not node.alive or len(node.dev_free) < m.devices or (only and node.name != only):
                continue
            if can_ever_place(node.spec, m) is not None:
                continue
            devs = choose_devices(node.dev_free, node.spec.gpu_domains, m.devices,
                                  memory_free=node.per_device_memory(), memory_needed=m.memory_mb)
            if devs is None or not node.fits({"gpu": float(m.devices)}):
                continue
            parked = self.parked.get((node.name, m.name), 0) > 0
            score = (0 if parked else 1, len(node.dev_free), node.name)
            if best is None or score < best[0]:
                best = (score, node, devs, parked)
        return None if best is None else (best[1], best[2], best[3])

    def launch(self, m: ModelSpec, node: NodeState, devices: tuple[int, ...], from_host: bool) -> InstanceRecord:
        self.instance_seq += 1
        inst = InstanceRecord(f"{m.name}#{self.instance_seq}", m, node.name, devices)
        inst.last_used = self.st.now
        self.instances[inst.id] = inst
        self.by_model.setdefault(m.name, set()).add(inst.id)
        node.dev_free.difference_update(devices)
        node.instances.add(inst.id)
        node.take(inst.holding())
        self.st.index.update(node.name, node.free)
        if from_host:
            self.parked[(node.name, m.name)] -= 1
        self.st.out.append(LoadModel(inst.id, m.name, node.name, devices, from_host, cause=self.st.cause))
        return inst

    def drop_instance(self, inst: InstanceRecord) -> None:
        del self.instances[inst.id]
        self.by_model[inst.model.name].discard(inst.id)
        node = self.st.nodes[inst.node]
        if inst.id in node.instances:
            node.instances.discard(inst.id)
            node.dev_free.update(inst.devices)
            node.give(inst.holding())
            if node.alive:
                self.st.index.update(node.name, node.free)
                self.st.dirty.add(node.name)
        self.st.models_touched.add(inst.model.name)

    def unload(self, inst: InstanceRecord, reason: str) -> None:
        self.drop_instance(inst)
        key = (inst.node, inst.model.name)
        self.parked[key] = self.parked.get(key, 0) + 1
        self.unparking[inst.id] = key
        self.st.out.append(UnloadModel(inst.id, inst.node, park=True, cause=reason))

    # ---- static provisioning --------------------------------------------------------------------
    def boot(self) -> None:
        self.booted = True
        if not self.dynamic:
            self.provision(None)
            return
        for m in sorted(self.st.models.values(), key=lambda m: m.name):  # the warm minimum
            for _ in range(min(self.st.config.model_min_instances, m.max_instances)):
                got = self.pick_devices(m)
                if got is None:
                    break
                self.launch(m, *got)
        if self.st.config.model_prewarm:
            self.fill_devices(None)

    def provision(self, only: str | None) -> None:
        """Provision a node (``only``) or the cluster: static policies load their fixed set,
        dynamic ones with ``model_prewarm`` fill the free devices (evictable later)."""
        if not self.dynamic or self.st.config.model_prewarm:
            self.fill_devices(only)

    def fill_devices(self, only: str | None) -> None:
        """Round-robin one instance per model until devices or ``max_instances`` run out."""
        static = not self.dynamic
        models = sorted(self.st.models.values(), key=lambda m: m.name)
        progress = True
        while progress:
            progress = False
            for m in models:
                if len(self.by_model.get(m.name, ())) >= m.max_instances:
                    continue
                got = self.pick_devices(m, only)
                if got is not None:
                    self.launch(m, *got)
                    if static:
                        self.static_target[m.name] = self.static_target.get(m.name, 0) + 1
                    progress = True

    # ---- events ---------------------------------------------------------------------------------
    def loaded(self, e: ModelLoaded) -> tuple[str, str] | None:
        """An instance finished loading (or failed to): ``(model, reason)`` when the model
        failed `max_load_failures` times in a row and its queue is to fail, else None."""
        inst = self.instances.get(e.instance_id)
        if inst is None or inst.state is not InstState.LOADING:
            return None
        name = inst.model.name
        self.st.models_touched.add(name)
        if e.ok:
            inst.state = InstState.READY
            inst.last_used = e.time
            self.load_failures[name] = 0
            return None
        self.drop_instance(inst)
        n = self.load_failures[name] = self.load_failures.get(name, 0) + 1
        if n >= self.st.config.max_load_failures:
            return name, f"model {name} failed to load {n} times: {e.reason}"
        return None

    def failures_reset(self, name: str) -> None:
        """The model's queue was failed: its next failure counts from one."""
        self.load_failures[name] = 0

    def unloaded(self, e: ModelUnloaded) -> tuple[list[ActionRecord], str, str]:
        """An instance was unloaded. One the core did not unload ended under it (evicted by its
        manager, or dead: ``e.reason``): it is dropped; a dead one is replaced at once (where
        devices allow) and the actions of its batch in flight are returned (to requeue or fail).
        After `max_load_failures` deaths of the model's instances with no batch scored between
        them, no replacement: the model and the reason are returned too, for its queue to fail
        (the next arrival loads it again), so a model whose instances all die does not reload in
        a loop. Returns (lost actions, model given up or "", reason)."""
        key = self.unparking.pop(e.instance_id, None)
        if key is not None and not e.parked and self.parked.get(key, 0) > 0:
            self.parked[key] -= 1
        inst = self.instances.get(e.instance_id)
        if inst is None:
            return [], "", ""
        lost = self.batch_lost(inst)
        self.drop_instance(inst)
        if e.parked:
            k = (inst.node, inst.model.name)
            self.parked[k] = self.parked.get(k, 0) + 1
        if not e.reason:
            return lost, "", ""
        m = inst.model
        n = self.worker_deaths[m.name] = self.worker_deaths.get(m.name, 0) + 1
        if n >= self.st.config.max_load_failures:
            self.worker_deaths[m.name] = 0
            return lost, m.name, f"model {m.name}: {n} instances died with no batch scored between: {e.reason}"
        if self.st.nodes[inst.node].alive:  # died: what it served is loaded again
            got = self.pick_devices(m)
            if got is not None and len(self.by_model.get(m.name, ())) < m.max_instances:
                self.launch(m, *got)
        return lost, "", ""

    def batch_lost(self, inst: InstanceRecord) -> list[ActionRecord]:
        """The actions of ``inst``'s batch in flight, which will never be scored by it."""
        if inst.batch is None:
            return []
        lost = []
        for bid, ids in [inst.batch, *inst.more.items()]:
            self.batches.pop(bid, None)
            for aid in ids:
                rec = self.st.actions.get(aid)
                if rec is not None and rec.batch == bid:
                    lost.append(rec)
        inst.batch = None
        inst.more.clear()
        return lost

    def batch_finished(self, e: BatchFinished) -> tuple[str, ...]:
        """A batch came back: its instance is free again; the ids of its actions."""
        got = self.batches.pop(e.batch_id, None)
        if got is None:
            return ()
        iid, ids = got
        inst = self.instances.get(iid)
        if inst is not None and e.outputs:
            self.worker_deaths[inst.model.name] = 0
        if inst is not None and inst.batch is not None and inst.batch[0] == e.batch_id:
            inst.batch = inst.more.popitem() if inst.more else None
            inst.last_used = e.time
            self.st.models_touched.add(inst.model.name)
        elif inst is not None and inst.more.pop(e.batch_id, None) is not None:
            inst.last_used = e.time
            self.st.models_touched.add(inst.model.name)
        return ids

    def lose_instances(self, node: NodeState) -> list[ActionRecord]:
        """``node`` is lost: its instances are gone; the actions of their batches in flight
        (to requeue or lose)."""
        lost: list[ActionRecord] = []
        for iid in sorted(node.instances):
            inst = self.instances[iid]
            lost.extend(self.batch_lost(inst))
            self.drop_instance(inst)
            if not self.dynamic:
                self.static_target[inst.model.name] -= 1
        for key in [k for k in self.parked if k[0] == node.name]:
            del self.parked[key]
        return lost

    # ---- dispatch and scaling -------------------------------------------------------------------
    def dispatch(self) -> None:
        if not self.st.models_touched:
            return
        for name, iids in self.by_model.items():  # starved models may evict idle ones
            if not iids and self.queues.live.get(model_key(name)):
                self.st.models_touched.add(name)
        todo = sorted(self.st.models_touched)
        self.st.models_touched.clear()
        for name in todo:
            m = self.st.models[name]
            if m.max_seqs > 0:
                self.fill_engines(m)
            else:
                for iid in sorted(self.by_model.get(name, ())):
                    inst = self.instances[iid]
                    if inst.state is InstState.READY and inst.batch is None:
                        self.run_batch(inst)
            if self.queues.live.get(model_key(name)):
                self.scale_out(m)

    def fill_engines(self, m: ModelSpec) -> None:
        """Continuous batching (``max_seqs > 0``): queued actions join the ready instance with
        the fewest sequences in flight (its sequences run fastest: least expected wait), each
        batch just large enough to level it with the next least loaded one, until the queue is
        empty or no instance has a free sequence. Where the prefix cache is weighed
        (``engine_routing`` "cost" and ``prefill_s > 0``), or another routing is asked for, each
        action is routed on its own (`route_each`)."""
        ready = [self.instances[iid] for iid in sorted(self.by_model.get(m.name, ()))
                 if self.instances[iid].state is InstState.READY]
        routing = self.st.config.engine_routing
        if routing != "least-loaded" and (routing != "cost" or m.prefill_s > 0.0):
            self.route_each(m, ready, routing)
            return
        key = model_key(m.name)
        while ready and self.queues.live.get(key, 0):
            best, low, second = None, 0, m.max_seqs
            for inst in ready:
                n = inst.seqs()
                if best is None or n < low:
                    if best is not None:
                        second = min(second, low)
                    best, low = inst, n
                else:
                    second = min(second, n)
            if best is None or low >= m.max_seqs:
                return
            before = low
            self.run_batch(best, max(1, second - low + 1))
            if best.seqs() == before:
                return

    def route_each(self, m: ModelSpec, ready: list[InstanceRecord], routing: str) -> None:
        """Each queued action in queue order to the instance `route` picks, until the queue is
        empty or no instance has a free sequence; one batch per instance (``max_batch`` at most
        each), in the order the instances were first picked."""
        key = model_key(m.name)
        load = {inst.id: inst.seqs() for inst in ready}
        picked: dict[str, list[ActionRecord]] = {}
        while (got := self.queues.head(key)) is not None:
            rec = got[0]
            inst = self.route(m, rec, ready, load, routing)
            if inst is None:
                break
            self.queues.dequeue(rec)
            load[inst.id] += 1
            picked.setdefault(inst.id, []).append(rec)
        for iid, recs in picked.items():
            for i in range(0, len(recs), m.max_batch):
                self.start_batch(self.instances[iid], recs[i:i + m.max_batch])

    def route(self, m: ModelSpec, rec: ActionRecord, ready: list[InstanceRecord],
              load: dict[str, int], routing: str) -> InstanceRecord | None:
        """The instance ``rec`` joins (None: every one is full); ``load``: sequences in flight
        on each, those routed in this pass counted. docs/core.md, "Routing to judge engines":

        - round-robin: the next instance in id order after the last one picked, with a free
          sequence;
        - sticky (verl's, ROLL's): the instance that served the action's trajectory while it
          has a free sequence, else the least loaded (fewest in flight, the first in id order);
        - cost: the least marginal delay to the sum of completion times: joining an instance
          with ``k`` in flight costs ``(k + 1) prefill_s U + 2 beta T k``, ``U`` its prompt
          tokens not cached there (all, but on the instance that served its trajectory's last
          prompt: the tokens beyond it), ``T`` its expected decode steps (its expected time
          alone over ``alpha + beta``): its prefill stalls the instance's ``k`` sequences and
          itself, and each step it shares slows it by ``beta k`` and the ``k`` others by
          ``beta`` each. Without a prefix this is the least loaded."""
        n = len(ready)
        if routing == "round-robin":
            at = self.rr.get(m.name, 0)
            for j in range(n):
                inst = ready[(at + j) % n]
                if load[inst.id] < m.max_seqs:
                    self.rr[m.name] = (at + j + 1) % n
                    return inst
            return None
        traj = rec.spec.trajectory
        prev = self.prefix.get(traj) if traj is not None else None
        tokens = rec.spec.hints.prompt_tokens or 0
        best: InstanceRecord | None = None
        if routing == "sticky":
            if prev is not None:
                for inst in ready:
                    if inst.id == prev[0] and load[inst.id] < m.max_seqs:
                        best = inst
            if best is None:
                for inst in ready:
                    if load[inst.id] < m.max_seqs and (best is None or load[inst.id] < load[best.id]):
                        best = inst
        else:
            steps = rec.est / (m.alpha + m.beta) if m.alpha + m.beta > 0.0 else 0.0
            low = math.inf
            for inst in ready:
                k = load[inst.id]
                if k >= m.max_seqs:
                    continue
                cached = min(tokens, prev[1]) if prev is not None and prev[0] == inst.id else 0
                cost = (k + 1) * m.prefill_s * (tokens - cached) + 2.0 * m.beta * steps * k
                if cost < low:
                    best, low = inst, cost
        if best is not None and traj is not None:
            self.prefix.pop(traj, None)  # (to the end: the oldest go first)
            self.prefix[traj] = (best.id, tokens)
            if len(self.prefix) > PREFIXES:
                del self.prefix[next(iter(self.prefix))]
        return best

    def run_batch(self, inst: InstanceRecord, limit: int = 0) -> None:
        m = inst.model
        key = model_key(m.name)
        live = self.queues.live.get(key, 0)
        if not live:
            return
        knee = m.knee_batch
        if m.max_seqs > 0:  # continuous batching: whatever is queued joins, up to free sequences
            knee = min(m.max_seqs - inst.seqs(), m.max_batch, limit or m.max_batch)
            if knee <= 0:
                return
        elif live < knee and self.st.config.max_batch_wait_s > 0:
            head = self.queues.head(key)
            if head is not None and self.st.now - head[0].submit_time < self.st.config.max_batch_wait_s:
                return  # let the batch fill (a Tick or arrival will come back)
        if m.max_seqs <= 0 and live < knee and self.staggered(m):
            return  # spread the starts (a Tick or arrival will come back)
        self.last_start[m.name] = self.st.now
        self.batch_seq += 1
        bid = f"b{self.batch_seq}"
        recs: list[ActionRecord] = []
        while len(recs) < knee and (got := self.queues.head(key)) is not None:
            rec = got[0]
            self.queues.dequeue(rec)
            rec.move(S.RUNNING, self.st.now, self.st.cause)
            rec.batch, rec.node, rec.start_time = bid, inst.node, self.st.now
            rec.allot(inst.holding())
            rec.attempts += 1
            recs.append(rec)
        self.emit_batch(inst, bid, recs)

    def start_batch(self, inst: InstanceRecord, recs: list[ActionRecord]) -> None:
        """Send ``recs`` (already out of their queue) to ``inst`` as one batch."""
        self.last_start[inst.model.name] = self.st.now
        self.batch_seq += 1
        bid = f"b{self.batch_seq}"
        for rec in recs:
            rec.move(S.RUNNING, self.st.now, self.st.cause)
            rec.batch, rec.node, rec.start_time = bid, inst.node, self.st.now
            rec.allot(inst.holding())
            rec.attempts += 1
        self.emit_batch(inst, bid, recs)

    def emit_batch(self, inst: InstanceRecord, bid: str, recs: list[ActionRecord]) -> None:
        m = inst.model
        ids = tuple(r.spec.id for r in recs)
        if inst.batch is None:
            inst.batch = (bid, ids)
        else:
            inst.more[bid] = ids
        self.batches[bid] = (inst.id, ids)
        self.st.out.append(RunBatch(bid, inst.id, inst.node, m.name, tuple(r.spec for r in recs),
                                  cause=self.st.cause))

    def note_arrival(self, name: str, t: float) -> None:
        """An action of model ``name`` arrived at ``t``: its arrival times over the last
        ``rate_window_s`` (the window warm pools measure rates over) give `arrival_rate`."""
        got = self.arrivals.get(name)
        if got is None:
            got = self.arrivals[name] = deque()
        got.append(t)
        while got[0] < t - self.st.config.rate_window_s:
            got.popleft()

    def arrival_rate(self, name: str) -> float:
        """Arrivals per second of model ``name`` between its first and last arrival in the
        window; 0 before two arrivals at distinct times."""
        got = self.arrivals.get(name)
        if not got or len(got) < 2:
            return 0.0
        span = got[-1] - got[0]
        return (len(got) - 1) / span if span > 0.0 else 0.0

    def staggered(self, m: ModelSpec) -> bool:
        """Whether an idle instance of ``m`` holds its batch (below the knee) to spread the
        starts of the model's instances (module doc): with ``n >= 2`` ready instances, the
        model's last start less than ``alpha / n`` ago and arrivals at least once per that gap."""
        if not self.st.config.stagger_batches or m.alpha <= 0.0:
            return False
        ready = 0
        for iid in self.by_model.get(m.name, ()):
            ready += self.instances[iid].state is InstState.READY
        if ready < 2:
            return False
        gap = m.alpha / ready
        last = self.last_start.get(m.name)
        if last is None or self.st.now - last >= gap:
            return False
        return self.arrival_rate(m.name) * gap >= 1.0

    def scale_out(self, m: ModelSpec) -> None:
        if not self.dynamic:  # static: only replace failed loads
            while len(self.by_model.get(m.name, ())) < self.static_target.get(m.name, 0):
                got = self.pick_devices(m)
                if got is None:
                    return
                self.launch(m, *got)
            return
        while len(self.by_model.get(m.name, ())) < m.max_instances:
            n = len(self.by_model.get(m.name, ()))
            got = self.pick_devices(m)
            if got is not None:
                if n > 0 and not self.worth_instance(m, n, got[2], free=True):
                    return
            elif len(self.st.models) > 1 and (n == 0 or self.worth_instance(m, n, None, free=False)):
                got = self.evict_for(m, starving=n == 0)
            if got is None:
                return
            self.launch(m, *got)

    def worth_instance(self, m: ModelSpec, n: int, parked: bool | None, *, free: bool) -> bool:
        """Whether one more instance of ``m`` (which has ``n``) pays for itself. On free
        devices: the expected drain time exceeds its cost, or the backlog exceeds what loading
        instances will take plus ``scale_out_batches`` knee batches per ready one. By eviction
        (another model pays with a swap-in later): only the expected drain time counts."""
        queued = self.queues.live.get(model_key(m.name), 0)
        if parked is None:  # where it would go is not known yet: parked weights anywhere?
            parked = any(k[1] == m.name and v > 0 for k, v in self.parked.items())
        cost = m.swap_s if parked else m.load_s
        wait = math.ceil(queued / m.knee_batch) * m.batch_latency(m.knee_batch) / n
        if wait > cost or not free:
            return wait > cost
        loading = sum(1 for i in self.by_model[m.name]
                      if self.instances[i].state is InstState.LOADING)
        # loading instances will each take a batch; ready ones may queue a few more
        absorb = m.knee_batch * (loading + self.st.config.scale_out_batches * (n - loading))
        return queued > absorb

    def victims(self, node: NodeState, exclude: str, starving: bool) -> list[InstanceRecord]:
        """Idle instances on ``node`` that may be parked for someone else, cheapest loss first:
        of models with no queued work, more replicas first, least recently used first. Unless
        the beneficiary has no instance (``starving``), a model keeps at least one instance
        and an instance used within its own swap time stays (it is likely needed again)."""
        out = []
        for iid in node.instances:
            i = self.instances[iid]
            name = i.model.name
            if (name == exclude or i.state is not InstState.READY or i.batch is not None
                    or self.queues.live.get(model_key(name))):
                continue
            if not starving and self.st.now - i.last_used < i.model.swap_s:
                continue
            out.append(i)
        by_model = self.by_model  # (no lambda over `self`: see placement's sort keys)
        out = [i for _, _, _, i in sorted((-len(by_model[i.model.name]), i.last_used, i.id, i) for i in out)]
        if not starving:  # each model keeps one instance
            left = {i.model.name: len(self.by_model[i.model.name]) for i in out}
            kept = []
            for i in out:
                if left[i.model.name] > 1:
                    left[i.model.name] -= 1
                    kept.append(i)
            out = kept
        return out

    def evict_for(self, m: ModelSpec, *, starving: bool) -> tuple[NodeState, tuple[int, ...], bool] | None:
        """Park the cheapest idle instances of other models on one node so that ``m`` fits
        there (the node needing the fewest, least-used evictions); None if no node can."""
        best: tuple[tuple[int, int, float, str], NodeState, list[InstanceRecord]] | None = None
        for node in self.st.nodes.values():
            if not node.alive or not node.instances or can_ever_place(node.spec, m) is not None:
                continue
            free, gpus, chosen = set(node.dev_free), node.free.get("gpu", 0.0), []
            per = node.spec.gpu_memory_per_device
            for v in self.victims(node, m.name, starving):
                chosen.append(v)
                free.update(v.devices)
                gpus += v.model.devices
                if gpus + 1e-9 >= m.devices and choose_devices(
                        free, node.spec.gpu_domains, m.devices, memory_free=dict.fromkeys(free, per),
                        memory_needed=m.memory_mb) is not None:
                    lost = sum(1 for v in chosen if len(self.by_model[v.model.name]) <= 1)
                    score = (lost, len(chosen), max(v.last_used for v in chosen), node.name)
                    if best is None or score < best[0]:
                        best = (score, node, chosen)
                    break
        if best is None:
            return None
        for v in best[2]:
            self.unload(v, f"evicted for model {m.name}")
        return self.pick_devices(m, only=best[1].name)

    def yield_devices(self) -> bool:
        """Lazy eviction for GPU actions: a shared-pool queue head that needs GPUs and fits a
        node once idle instances there are parked gets that node (then a new pass runs)."""
        freed = False
        gpu_shape = self.needs_gpu
        for key in list(self.queues.shape_keys):
            needs = gpu_shape.get(key)
            if needs is None:
                needs = gpu_shape[key] = any(d == "gpu" and v > 0 for d, v in key.shape)
            if not needs:
                continue
            got = self.queues.head(key)
            if got is None:
                continue
            rec = got[0]
            demand = rec.spec.demand
            best: tuple[tuple[int, float, str], NodeState, list[InstanceRecord]] | None = None
            for node in self.st.nodes.values():
                if (not node.alive or not node.instances
                        or self.st.reserved.get(node.name, rec.spec.id) != rec.spec.id):
                    continue
                free, chosen = dict(node.free), []
                for v in self.victims(node, "", True):
                    chosen.append(v)
                    for d, x in v.holding().items():
                        free[d] = free.get(d, 0.0) + x
                    if all(x <= free.get(d, 0.0) + 1e-9 for d, x in demand.items()):
                        score = (len(chosen), max(v.last_used for v in chosen), node.name)
                        if best is None or score < best[0]:
                            best = (score, node, chosen)
                        break
            if best is not None:
                for v in best[2]:
                    self.unload(v, f"evicted for action {rec.spec.id}")
                freed = True
        return freed

    def scale_in(self) -> None:
        """On a Tick: unload instances idle past ``model_idle_s`` (dynamic policies), and let
        every model with queued work look again (a held batch, `staggered`, starts on the first
        event after its hold ends: the same rule under every policy)."""
        for name in self.st.models:
            if self.queues.live.get(model_key(name)):
                self.st.models_touched.add(name)
        if not self.dynamic:
            return
        limit = self.st.config.model_idle_s
        keep = self.st.config.model_min_instances
        for iid in sorted(self.instances) if math.isfinite(limit) else ():
            inst = self.instances[iid]
            if len(self.by_model[inst.model.name]) <= keep:
                continue
            if (inst.state is InstState.READY and inst.batch is None
                    and not self.queues.live.get(model_key(inst.model.name))
                    and self.st.now - inst.last_used >= limit):
                self.unload(inst, f"idle {self.st.now - inst.last_used:.3g}s")
