"""Mutable per-object state of the core: actions, nodes, sessions, model instances.

Invariant: an action's status changes only through `ActionRecord.move`, which looks the edge up
in `TRANSITIONS` and raises `IllegalTransition` (with the action's story) for any other edge.
Statuses only move forward except the one backward edge ``requeue`` (STARTING/RUNNING ->
QUEUED after a node loss, for idempotent actions).

These are internal records (plain slotted classes, mutated in place by the core only); what
leaves the core is frozen (`view.CoreView`, `ActionResult`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Literal, TypeAlias, TypeGuard

from mypy_extensions import mypyc_attr

from .actions import ActionKind, ActionSpec, Status
from .cluster import ModelSpec, NodeSpec
from .errors import IllegalTransition
from .resources import CPU, GPU_MEMORY_MB, Resources

S = Status
_MODEL_KINDS = frozenset(k for k in ActionKind if k.uses_model)
_MODEL_KINDS_T = tuple(_MODEL_KINDS)


@mypyc_attr(native_class=False)  # (compiled classes cannot subclass str)
class ShapeKey(str):
    """The key of a demand shape's shared-pool queue (`ActionRecord.skey`): ``"shape"`` and the
    demand's items, sorted, as text -- a str, because a str computes its hash once, where a
    tuple of floats rehashes them at every dict and set operation (a queue key is looked up
    several times per action). ``shape`` holds the sorted items, ``cpu`` their CPU amount.
    Equal shapes give equal keys, and records share one key object per shape (`_SHAPES`).
    The other queue keys are tuples ``(kind, name)`` (`QueueKey`); tell a shape key by its
    type."""

    shape: tuple[tuple[str, float], ...]
    cpu: float
    elastic: bool  # its actions are elastic (never in one queue with rigid ones)
    tenant: str  # whose actions it queues ("": everyone's; `tenant_shape_key`)


# The queue keys (`QueueKey`): a shared-pool queue's is its demand's `ShapeKey`; the others are
# ``(kind, name)`` tuples -- plain tuples, not classes of their own, so that they hash (and sets
# of them iterate) as they always did -- made by the functions below and told apart by them.
SessionKey: TypeAlias = tuple[Literal["sess"], str]  # a session's actions
PartitionKey: TypeAlias = tuple[Literal["part"], str]  # a partition's (the static baselines)
ModelKey: TypeAlias = tuple[Literal["model"], str]  # a model's actions
QueueKey: TypeAlias = ShapeKey | SessionKey | PartitionKey | ModelKey


def session_key(session_id: str) -> SessionKey:
    return ("sess", session_id)


def partition_key(partition: str) -> PartitionKey:
    return ("part", partition)


def model_key(model: str) -> ModelKey:
    return ("model", model)


def is_session_key(key: QueueKey) -> TypeGuard[SessionKey]:
    return type(key) is tuple and key[0] == "sess"


def is_partition_key(key: QueueKey) -> TypeGuard[PartitionKey]:
    return type(key) is tuple and key[0] == "part"


def is_model_key(key: QueueKey) -> TypeGuard[ModelKey]:
    return type(key) is tuple and key[0] == "model"


def _make_shape_key(items: tuple[tuple[str, float], ...], elastic: bool = False) -> ShapeKey:
    shape = tuple(sorted(items))
    # (a float's repr round-trips: one text per shape)
    key = ShapeKey(("elastic" if elastic else "shape") + repr(shape))
    key.shape = shape
    key.cpu = dict(shape).get(CPU, 0.0)
    key.elastic = elastic
    key.tenant = ""
    return key


# (shape key, tenant) -> that tenant's queue of the shape (`tenant_shape_key`)
_TENANT_SHAPES: dict[tuple[ShapeKey, str], ShapeKey] = {}


def tenant_shape_key(skey: ShapeKey, tenant: str) -> ShapeKey:
    """The key of ``tenant``'s own queue of ``skey``'s shape (fair share: each tenant's actions
    of a shape queue apart, so that the pass can choose the tenant before the action): the
    shape's text and ``|tenant=NAME``; one shared object per shape and tenant."""
    got = _TENANT_SHAPES.get((skey, tenant))
    if got is None:
        if len(_TENANT_SHAPES) > 4096:
            _TENANT_SHAPES.clear()
        got = ShapeKey(f"{skey}|tenant={tenant}")
        got.shape = skey.shape
        got.cpu = skey.cpu
        got.elastic = skey.elastic
        got.tenant = tenant
        _TENANT_SHAPES[(skey, tenant)] = got
    return got


# demand items as stored -> their `ShapeKey`: one shared key per shape, so records do not each
# keep a copy (fewer objects for the garbage collector to scan, and equal keys are the same
# object)
_SHAPES: dict[tuple[tuple[tuple[str, float], ...], bool], ShapeKey] = {}
# (`in` a tuple tests identity first: no enum hashing)
_TERMINAL = (S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.REJECTED, S.NODE_LOST)

# (from, to) -> the name of the edge. Anything not listed is illegal.
TRANSITIONS: dict[tuple[Status, Status], str] = {
    (S.PENDING, S.QUEUED): "queue",
    (S.PENDING, S.REJECTED): "reject",
    (S.QUEUED, S.STARTING): "start",
    (S.QUEUED, S.RUNNING): "batch",  # model actions start when their batch is sent
    (S.STARTING, S.RUNNING): "started",
    (S.STARTING, S.QUEUED): "requeue",
    (S.RUNNING, S.QUEUED): "requeue",
}
for _t in (S.CANCELLED, S.NODE_LOST, S.FAILED, S.REJECTED, S.TIMED_OUT):
    TRANSITIONS[(S.QUEUED, _t)] = "drop"
# a provider call that waited for an identical one in flight gets its answer (coalesced)
TRANSITIONS[(S.QUEUED, S.SUCCEEDED)] = "served"
for _src in (S.STARTING, S.RUNNING):
    for _t in _TERMINAL:
        if _t is not S.REJECTED:
            TRANSITIONS[(_src, _t)] = "end"

# `TRANSITIONS` as a table indexed by the statuses' int values: `move` runs on every transition,
# and a list index costs less than hashing a pair of enum members.
_EDGES: list[list[str | None]] = [[None] * (max(S) + 1) for _ in range(max(S) + 1)]
for (_a, _b), _name in TRANSITIONS.items():
    _EDGES[_a][_b] = _name
_PENDING = S.PENDING  # (a module constant: an enum member read from its class costs more)


def warm_key(spec: ActionSpec) -> str:
    """What kind of warm executor an action can use: its language, tag, or kind."""
    lang = spec.payload.get("language") if spec.payload else None
    return str(lang or spec.tag or spec.kind._value_)  # (_value_: `.value` without the property)


class ActionRecord:
    """Everything the core tracks about one arrived action."""

    __slots__ = (
        "aging_parked",
        "allotment",
        "attempts",
        "batch",
        "charge",
        "cpu",
        "done",
        "ekey",
        "el_cpu",
        "el_max",
        "el_min",
        "el_rank",
        "elastic",
        "est",
        "gen",
        "is_model",
        "left",
        "left_done",
        "left_version",
        "lent_on",
        "node",
        "partition",
        "queue_key",
        "rate",
        "seq",
        "shape",
        "since",
        "skey",
        "spec",
        "start_time",
        "status",
        "story",
        "submit_time",
        "tenant",
        "units",
        "width",
        "wkey",
    )

    def __init__(self, spec: ActionSpec, time: float, seq: int) -> None:
        self.spec = spec
        self.status = _PENDING
        self.submit_time = time
        self.start_time: float | None = None
        self.node: str | None = None
        self.allotment: Resources | None = None
        self.attempts = 0
        self.seq = seq  # arrival order, breaks ties deterministically
        self.gen = 0  # bumped whenever queued entries for it become stale
        self.est = 0.0  # expected execution time at the minimum allotment
        self.ekey: tuple[str, str] = ("", "")  # (estimator key, basis): `DurationEstimator.work_of`
        self.units = 1.0  # work units of that basis
        self.batch: str | None = None  # batch id while in a RunBatch
        self.partition: str | None = None  # slice / task pool of partitioned policies
        self.queue_key: QueueKey | None = None  # which queue holds it while QUEUED
        # when its aging entries would have come due, kept off the aging heap while it is not
        # queued (`Queues.park_aging`); a requeue puts back those still due
        self.aging_parked: tuple[float, ...] | None = None
        self.is_model = spec.kind in _MODEL_KINDS_T
        el = spec.elasticity
        # elastic (`Elasticity.is_elastic`): its own queues, a width chosen at its start
        self.elastic = el is not None and el.max > el.min
        # its elasticity's range, and whether it stretches in CPU: read for every elastic
        # action on a node by the lane rule's walks, without the spec's attribute lookups
        # (issue 40); 0.0 and False without one
        self.el_min = el.min if el is not None else 0.0
        self.el_max = el.max if el is not None else 0.0
        self.el_cpu = el is not None and el.dim == CPU
        # while it runs stretching in CPU: its node's `NodeState.lent` (where `allot` keeps it
        # while it holds more than its minimum) and its place in the node's `elastic`
        self.lent_on: dict[str, ActionRecord] | None = None
        self.el_rank = 0
        # work done (seconds at speed 1) by `since`, while it runs: what is left of its
        # estimate when the allotment of an elastic action changes (`Elastic.remaining`)
        self.done = 0.0
        self.since = 0.0
        # what follows from the allotment (`allot`): its speed (`speed`; -1.0 until asked) and,
        # for an elastic action, its width in the elastic dimension (the lane rule reads both
        # for every elastic action on a node, without the allotment's mapping)
        self.rate = -1.0
        self.width = 0.0
        # `Elastic.remaining`'s last answer: the work left (`left`) with `left_done` done, as
        # the estimator's `version` `left_version` saw it (-1: none; versions start at 0)
        self.left = 0.0
        self.left_done = 0.0
        self.left_version = -1
        d = spec.demand._d
        skey = shape_key(d, self.elastic)
        self.skey = skey  # its shared-pool queue's key (`ShapeKey`)
        self.shape: tuple[tuple[str, float], ...] = skey.shape  # the demand's items, sorted
        self.cpu: float = d.get(CPU, 0.0)  # the demand's CPU (hot path of placement)
        # what its node is charged while it runs, when less than its demand (a short action
        # admitted by its measured CPU use: `Core._charge`); its quota stays the demand
        self.charge: Resources | None = None
        self.wkey = warm_key(spec)  # which warm executors it can use
        # its tenant's name while the core shares by tenant (`CoreConfig.tenant_shares`: set
        # at arrival, "" for actions naming none); "" otherwise
        self.tenant = ""
        # Formatted only on demand. One flat tuple: (time, from status or note or resized
        # dimension, to status or None or new width, cause) per line, statuses as plain ints.
        # Records outlive their action in the core's history; a tuple of floats, ints and
        # strings is one object the garbage collector stops tracking, where a list of lines
        # (or enum members, or allotments, in it) would be rescanned for good.
        self.story: tuple[object, ...] = ()

    def allot(self, alloc: Resources) -> None:
        """Its allotment is now ``alloc`` (the only way it changes)."""
        self.allotment = alloc
        self.rate = -1.0
        if self.elastic:
            el = self.spec.elasticity
            assert el is not None
            self.width = width = alloc.get(el.dim)
            lent = self.lent_on
            if lent is not None:
                if width > self.el_min:
                    lent[self.spec.id] = self
                else:
                    lent.pop(self.spec.id, None)

    def speed(self) -> float:
        """Its speed at its allotment (`ActionSpec.speed`), kept until the allotment changes."""
        r = self.rate
        if r < 0.0:
            assert self.allotment is not None
            r = self.rate = self.spec.speed(self.allotment)
        return r

    def move(self, dst: Status, time: float, cause: str) -> None:
        src = self.status
        if _EDGES[src][dst] is None:  # (TRANSITIONS.get((self.status, dst)))
            raise IllegalTransition(self.spec.id, src.name, dst.name, self.describe())
        self.story += (time, src._value_, dst._value_, cause)
        self.status = dst

    def note(self, time: float, what: str, cause: str) -> None:
        self.story += (time, what, None, cause)

    def note_width(self, time: float, dim: str, width: float, cause: str) -> None:
        """Its allotment in ``dim`` is now ``width`` (a resize; formatted only on demand)."""
        self.story += (time, dim, width, cause)

    def describe(self) -> list[str]:
        return describe_story(self.story)


def shape_key(d: dict[str, float], elastic: bool = False) -> ShapeKey:
    """The shared `ShapeKey` of a demand's items (one object per distinct demand; elastic
    actions have keys of their own, so a rigid action never queues behind an elastic one that
    waits for its width)."""
    items = tuple(d.items())
    skey = _SHAPES.get((items, elastic))
    if skey is None:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        skey = _SHAPES[(items, elastic)] = _make_shape_key(items, elastic)
    return skey


def describe_story(s: tuple[object, ...]) -> list[str]:
    """An action's story (`ActionRecord.story`) as lines of text."""
    out = []
    for i in range(0, len(s), 4):
        t, a, b, cause = s[i:i + 4]
        if isinstance(b, int):  # a transition (statuses as ints)
            what = f"{Status(a).name}->{Status(b).name}"  # type: ignore[arg-type]
        elif isinstance(b, float):  # a resize (`note_width`)
            what = f"allotment {a} -> {b:g}"
        else:
            what = str(a)
        out.append(f"t={t:.6g} {what} (cause {cause})")
    return out


class NodeState:
    """A node's capacity and what is allocated on it."""

    __slots__ = (
        "alive",
        "cap",
        "dev_free",
        "elastic",
        "free",
        "grown",
        "instances",
        "joined",
        "lent",
        "moves",
        "name",
        "running",
        "sessions",
        "spec",
        "used",
        "warm",
    )

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.cap: dict[str, float] = spec.capacity.as_dict()
        self.used: dict[str, float] = {}
        self.free: dict[str, float] = dict(self.cap)
        self.alive = True
        self.running: set[str] = set()  # action ids holding an allotment here
        # the elastic ones among them, in start order: what `Elastic.plan` weighs, without a
        # look-up of every action running here (checks.py: exactly those)
        self.elastic: dict[str, ActionRecord] = {}
        # those of them stretching in CPU that hold more than their minimum (`ActionRecord
        # .allot` keeps it: exactly those), and how many joined `elastic` so far (each one's
        # `el_rank`): what lends CPU, in `elastic`'s order, without a walk of every run
        # there (issue 40: a crowded node's runs sit at their minimum, a few above it)
        self.lent: dict[str, ActionRecord] = {}
        self.joined = 0
        self.sessions: set[str] = set()
        self.instances: set[str] = set()
        self.dev_free: set[int] = set(range(spec.gpu_count))
        self.warm: dict[str, int] = {}
        # how many times capacity came back (`give`): where it is unchanged, nothing fits
        # that did not (`Sessions.open_pending` looks again only where it moved)
        self.grown = 0
        # how many times its allotments changed (`take` or `give`): where it is unchanged at
        # one instant, an elastic head that waited there waits again (`Elastic.width_on`)
        self.moves = 0  # pragma: no mutate (only compared with itself)

    def take(self, r: Mapping[str, float]) -> None:
        used, free, cap = self.used, self.free, self.cap
        self.moves += 1  # pragma: no mutate (any step counts a change)
        for k, v in (r._d if type(r) is Resources else r).items():
            u = used.get(k, 0.0) + v
            used[k] = u
            free[k] = cap.get(k, 0.0) - u

    def give(self, r: Mapping[str, float]) -> None:
        used, free, cap = self.used, self.free, self.cap
        self.grown += 1  # pragma: no mutate (any step counts a return)
        self.moves += 1  # pragma: no mutate (any step counts a change)
        for k, v in (r._d if type(r) is Resources else r).items():
            u = used.get(k, 0.0) - v
            if u < 1e-9:
                u = 0.0
            used[k] = u
            free[k] = cap.get(k, 0.0) - u

    def fits(self, r: Mapping[str, float]) -> bool:
        free = self.free
        for k, v in (r._d if type(r) is Resources else r).items():  # hot path: a plain loop is faster than all()
            if v > free.get(k, 0.0) + 1e-9:
                return False
        return True

    def per_device_memory(self) -> dict[int, float]:
        per = self.spec.gpu_memory_per_device
        return {d: per for d in self.dev_free}


class SessionRecord:
    """An open (or waiting to open) session."""

    __slots__ = ("actions", "attachment", "charge", "demand", "id", "last_active", "node",
                 "peak_mb", "task", "trajectory", "ttl_s", "warm_key")

    def __init__(self, sid: str, demand: Resources, ttl_s: float, time: float,
                 trajectory: str | None = None, task: str | None = None,
                 warm_key: str | None = None, attachment: object = None) -> None:
        self.id = sid
        # what the driver attached to its request, opaque to the core: carried to its node on
        # its `OpenSession` (the runtime's: the environment image, `runtime.images.SessionImage`)
        self.attachment = attachment
        self.demand = demand
        self.ttl_s = ttl_s
        self.trajectory = trajectory  # whose slice / pool it opens in (partitioned policies)
        self.task = task
        self.warm_key = warm_key  # nodes warm for it are preferred (SessionRequested.warm_key)
        self.node: str | None = None  # None until it is opened on a node
        self.last_active = time
        self.actions: set[str] = set()  # live actions naming it
        # what its node is charged while it is open: its demand, or once its node reported its
        # measured memory, that memory_mb by use (`sessionmem.SessionMemory`)
        self.charge = demand
        self.peak_mb = -1.0  # its recent peak memory as last reported (MB; -1: no report yet)


class InstState(enum.IntEnum):
    LOADING = 0
    READY = 1


class InstanceRecord:
    """A model instance on a set of devices of one node."""

    __slots__ = ("batch", "devices", "id", "last_used", "model", "more", "node", "state")

    def __init__(self, iid: str, model: ModelSpec, node: str, devices: tuple[int, ...]) -> None:
        self.id = iid
        self.model = model
        self.node = node
        self.devices = devices
        self.state = InstState.LOADING
        self.batch: tuple[str, tuple[str, ...]] | None = None  # (batch id, action ids) in flight
        # further batches in flight at once (continuous batching, ``model.max_seqs > 0`` only;
        # empty whenever ``batch`` is None): batch id -> action ids
        self.more: dict[str, tuple[str, ...]] = {}
        self.last_used = 0.0

    def seqs(self) -> int:
        """Actions in flight on the instance (in every batch)."""
        n = len(self.batch[1]) if self.batch is not None else 0
        for ids in self.more.values():
            n += len(ids)
        return n

    def holding(self) -> Resources:
        """What the instance holds on its node."""
        m = self.model
        return Resources._raw({"gpu": float(m.devices), GPU_MEMORY_MB: m.memory_mb * m.devices})
