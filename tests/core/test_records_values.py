"""core/records.py's values (issue 43 item 2: the survivors of `make mutation` on it): the queue
keys (``("sess", id)``, ``("part", name)``, ``("model", name)`` and which of them each `is_*`
check accepts), a demand's `ShapeKey` (its text, sorted items, CPU, elastic flag and tenant; one
shared object per demand and per tenant, the two caches cleared only past 4096 entries), the
warm key an action can use, an `ActionRecord`'s state at arrival, its allotment, speed, story
and transitions (every legal edge, and the error of an illegal one), a `NodeState`'s capacity
taken, given back (a use at or under 1e-9 kept as 0.0) and checked with the 1e-9 tolerance, and
the initial state of session and model-instance records, with an instance's sequences and
holding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from arl_tangram.core import records
from arl_tangram.core.actions import ActionKind, ActionSpec, Elasticity, Speedup, Status
from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.errors import IllegalTransition
from arl_tangram.core.records import (
    ActionRecord,
    InstanceRecord,
    InstState,
    NodeState,
    SessionRecord,
    ShapeKey,
    describe_story,
    is_model_key,
    is_partition_key,
    is_session_key,
    model_key,
    partition_key,
    session_key,
    shape_key,
    tenant_shape_key,
    warm_key,
)
from arl_tangram.core.resources import Resources

S = Status


# ---- queue keys -----------------------------------------------------------------------------


def test_queue_keys_are_kind_and_name_tuples() -> None:
    assert session_key("s1") == ("sess", "s1")
    assert partition_key("p1") == ("part", "p1")
    assert model_key("m1") == ("model", "m1")


def test_each_check_accepts_only_its_kind_of_key() -> None:
    keys = {
        "sess": session_key("s1"),
        "part": partition_key("p1"),
        "model": model_key("m1"),
        "shape": shape_key({"cpu": 1.0}),
        "elastic": shape_key({"cpu": 1.0}, True),
    }
    checks = {"sess": is_session_key, "part": is_partition_key, "model": is_model_key}
    got = {(c, k): check(key) for c, check in checks.items() for k, key in keys.items()}
    assert got == {(c, k): c == k for c in checks for k in keys}
    # a key whose name is the kind's word is still told by its kind, not its name
    assert is_session_key(partition_key("sess")) is False
    assert is_partition_key(model_key("part")) is False
    assert is_model_key(session_key("model")) is False


# ---- shape keys -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    """Empty shape-key caches for each test here (so that every key a test asks for is made
    anew, as on its first use); the keys other tests made are put back after."""
    shapes, tenants = dict(records._SHAPES), dict(records._TENANT_SHAPES)
    records._SHAPES.clear()
    records._TENANT_SHAPES.clear()
    try:
        yield
    finally:
        records._SHAPES.clear()
        records._SHAPES.update(shapes)
        records._TENANT_SHAPES.clear()
        records._TENANT_SHAPES.update(tenants)


def test_a_shape_key_is_its_sorted_items_as_text() -> None:
    k = shape_key({"memory_mb": 512.0, "cpu": 2.0})
    assert type(k) is ShapeKey
    assert str(k) == "shape(('cpu', 2.0), ('memory_mb', 512.0))"
    assert k.shape == (("cpu", 2.0), ("memory_mb", 512.0))
    assert k.cpu == 2.0
    assert k.elastic is False
    assert k.tenant == ""


def test_an_elastic_shape_key_is_its_own_text() -> None:
    k = shape_key({"cpu": 1.0, "memory_mb": 64.0}, True)
    assert str(k) == "elastic(('cpu', 1.0), ('memory_mb', 64.0))"
    assert k.shape == (("cpu", 1.0), ("memory_mb", 64.0))
    assert k.cpu == 1.0
    assert k.elastic is True
    assert k.tenant == ""
    rigid = shape_key({"cpu": 1.0, "memory_mb": 64.0})
    assert rigid != k and rigid.elastic is False


def test_a_shape_key_without_cpu_has_none() -> None:
    k = shape_key({"gpu": 1.0, "gpu_memory_mb": 800.0})
    assert str(k) == "shape(('gpu', 1.0), ('gpu_memory_mb', 800.0))"
    assert k.cpu == 0.0


def test_a_shape_key_is_rigid_by_default() -> None:
    # (the core's key for an action charged less than its demand: `shape_key(charge._d)`)
    k = shape_key({"cpu": 0.25})
    assert str(k) == "shape(('cpu', 0.25),)"
    assert k.elastic is False
    assert k is shape_key({"cpu": 0.25}, False)


def test_one_shape_key_object_per_demand() -> None:
    a = shape_key({"cpu": 3.0, "memory_mb": 100.0})
    b = shape_key({"cpu": 3.0, "memory_mb": 100.0})
    assert a is b
    e = shape_key({"cpu": 3.0, "memory_mb": 100.0}, True)
    assert e is shape_key({"cpu": 3.0, "memory_mb": 100.0}, True)
    assert e is not a


def test_the_shape_cache_is_cleared_only_past_4096_keys() -> None:
    first = shape_key({"cpu": 0.5})
    for i in range(1, 4096):
        shape_key({"cpu": 1000.0 + i})
    assert len(records._SHAPES) == 4096
    shape_key({"cpu": 0.75})  # 4096 held: not past the bound, kept
    assert len(records._SHAPES) == 4097
    assert shape_key({"cpu": 0.5}) is first
    shape_key({"cpu": 0.875})  # 4097 held: cleared, then this one added
    assert len(records._SHAPES) == 1
    again = shape_key({"cpu": 0.5})
    assert again is not first and again == first


def test_a_tenant_shape_key_names_the_tenant() -> None:
    base = shape_key({"cpu": 2.0, "memory_mb": 256.0})
    k = tenant_shape_key(base, "acme")
    assert type(k) is ShapeKey
    assert str(k) == "shape(('cpu', 2.0), ('memory_mb', 256.0))|tenant=acme"
    assert k.shape == (("cpu", 2.0), ("memory_mb", 256.0))
    assert k.cpu == 2.0
    assert k.elastic is False
    assert k.tenant == "acme"
    assert tenant_shape_key(base, "acme") is k
    other = tenant_shape_key(base, "zeta")
    assert str(other) == "shape(('cpu', 2.0), ('memory_mb', 256.0))|tenant=zeta"
    assert other.tenant == "zeta" and other is not k
    el = tenant_shape_key(shape_key({"cpu": 1.5}, True), "acme")
    assert str(el) == "elastic(('cpu', 1.5),)|tenant=acme"
    assert el.elastic is True and el.cpu == 1.5 and el.shape == (("cpu", 1.5),)


def test_the_tenant_cache_is_cleared_only_past_4096_keys() -> None:
    base = shape_key({"cpu": 1.0})
    first = tenant_shape_key(base, "t0")
    for i in range(1, 4096):
        tenant_shape_key(base, f"t{i}")
    assert len(records._TENANT_SHAPES) == 4096
    tenant_shape_key(base, "new-a")  # 4096 held: kept
    assert len(records._TENANT_SHAPES) == 4097
    assert tenant_shape_key(base, "t0") is first
    tenant_shape_key(base, "new-b")  # 4097 held: cleared, then this one added
    assert len(records._TENANT_SHAPES) == 1
    again = tenant_shape_key(base, "t0")
    assert again is not first and again == first and again.tenant == "t0"


# ---- warm keys --------------------------------------------------------------------------------


def test_warm_key_is_the_language_then_the_tag_then_the_kind() -> None:
    both = ActionSpec("a", payload={"language": "python", "code": "1"}, tag="bash")
    assert warm_key(both) == "python"
    lang = ActionSpec("b", payload={"language": "go"})
    assert warm_key(lang) == "go"
    tag = ActionSpec("c", payload={"code": "1"}, tag="bash")
    assert warm_key(tag) == "bash"
    assert warm_key(ActionSpec("d", kind=ActionKind.TOOL)) == "tool"
    assert warm_key(ActionSpec("e", payload={"code": "1"})) == "code"


# ---- action records ---------------------------------------------------------------------------


def test_a_record_at_arrival() -> None:
    spec = ActionSpec("a1", demand=Resources(cpu=2, memory_mb=512), payload={"language": "rust"})
    rec = ActionRecord(spec, 12.5, 7)
    assert rec.spec is spec
    assert rec.status is S.PENDING
    assert rec.submit_time == 12.5
    assert rec.start_time is None
    assert rec.node is None
    assert rec.allotment is None
    assert rec.attempts == 0
    assert rec.seq == 7
    assert rec.gen == 0
    assert rec.est == 0.0
    assert rec.ekey == ("", "")
    assert rec.units == 1.0
    assert rec.batch is None
    assert rec.partition is None
    assert rec.queue_key is None
    assert rec.aging_parked is None
    assert rec.is_model is False
    assert rec.elastic is False
    assert rec.done == 0.0
    assert rec.since == 0.0
    assert rec.rate == -1.0
    assert rec.width == 0.0
    assert rec.skey is shape_key({"cpu": 2.0, "memory_mb": 512.0})
    assert str(rec.skey) == "shape(('cpu', 2.0), ('memory_mb', 512.0))"
    assert rec.shape == (("cpu", 2.0), ("memory_mb", 512.0))
    assert rec.cpu == 2.0
    assert rec.charge is None
    assert rec.wkey == "rust"
    assert rec.tenant == ""
    assert rec.story == ()
    assert rec.describe() == []


def test_model_kinds_are_model_actions() -> None:
    got = {
        kind: ActionRecord(ActionSpec(f"x-{kind}", kind=kind, model="rm"), 0.0, 1).is_model
        for kind in ActionKind
    }
    assert got == {
        k: k in (ActionKind.REWARD, ActionKind.JUDGE, ActionKind.RETRIEVE) for k in ActionKind
    }


def test_a_record_without_cpu_has_none() -> None:
    spec = ActionSpec(
        "g", kind=ActionKind.REWARD, model="rm", demand=Resources(gpu=1, gpu_memory_mb=800)
    )
    rec = ActionRecord(spec, 0.0, 1)
    assert rec.cpu == 0.0
    assert rec.skey.cpu == 0.0
    assert rec.wkey == "reward"


def test_elastic_only_with_a_range() -> None:
    el = ActionSpec("e", demand=Resources(cpu=1, memory_mb=64), elasticity=Elasticity(1.0, 4.0))
    rec = ActionRecord(el, 0.0, 1)
    assert rec.elastic is True
    assert rec.skey.elastic is True
    assert str(rec.skey) == "elastic(('cpu', 1.0), ('memory_mb', 64.0))"
    assert rec.skey is shape_key({"cpu": 1.0, "memory_mb": 64.0}, True)
    flat = ActionSpec("f", demand=Resources(cpu=2, memory_mb=64), elasticity=Elasticity(2.0, 2.0))
    rec = ActionRecord(flat, 0.0, 2)
    assert rec.elastic is False
    assert str(rec.skey) == "shape(('cpu', 2.0), ('memory_mb', 64.0))"
    rigid = ActionRecord(ActionSpec("r", demand=Resources(cpu=1, memory_mb=64)), 0.0, 3)
    assert rigid.elastic is False
    assert rigid.skey is shape_key({"cpu": 1.0, "memory_mb": 64.0})


def test_allot_sets_the_allotment_and_forgets_the_speed() -> None:
    rec = ActionRecord(ActionSpec("a", demand=Resources(cpu=2, memory_mb=64)), 0.0, 1)
    half = Resources(cpu=1, memory_mb=64)
    rec.allot(half)
    assert rec.allotment is half
    assert rec.rate == -1.0
    assert rec.width == 0.0  # rigid: no width
    assert rec.speed() == 0.5
    assert rec.rate == 0.5
    full = Resources(cpu=2, memory_mb=64)
    rec.allot(full)
    assert rec.allotment is full
    assert rec.rate == -1.0
    assert rec.speed() == 1.0
    assert rec.rate == 1.0


def test_allot_sets_an_elastic_actions_width() -> None:
    linear = Elasticity(1.0, 4.0, speedup=Speedup(1.0))  # speed k on k cores
    spec = ActionSpec("e", demand=Resources(cpu=1, memory_mb=64), elasticity=linear)
    rec = ActionRecord(spec, 0.0, 1)
    rec.allot(spec.allotment(3.0))
    assert rec.width == 3.0
    assert rec.rate == -1.0
    assert rec.speed() == 3.0
    assert rec.rate == 3.0
    rec.allot(spec.allotment(2.0))
    assert rec.width == 2.0
    assert rec.rate == -1.0
    assert rec.speed() == 2.0


def test_the_story_of_moves_notes_and_resizes() -> None:
    rec = ActionRecord(ActionSpec("a"), 0.0, 1)
    rec.move(S.QUEUED, 1.5, "arrived")
    rec.note(2.0, "waits for node n1", "place")
    rec.move(S.STARTING, 2.25, "placed")
    rec.note_width(3.0, "cpu", 2.5, "grow")
    rec.move(S.RUNNING, 1234567.891, "started")
    assert rec.status is S.RUNNING
    assert len(rec.story) == 20  # one flat tuple, four items a line
    assert [rec.story[i : i + 4] for i in range(0, 20, 4)] == [
        (1.5, 0, 1, "arrived"),
        (2.0, "waits for node n1", None, "place"),
        (2.25, 1, 2, "placed"),
        (3.0, "cpu", 2.5, "grow"),
        (1234567.891, 2, 3, "started"),
    ]
    assert rec.describe() == [
        "t=1.5 PENDING->QUEUED (cause arrived)",
        "t=2 waits for node n1 (cause place)",
        "t=2.25 QUEUED->STARTING (cause placed)",
        "t=3 allotment cpu -> 2.5 (cause grow)",
        "t=1.23457e+06 STARTING->RUNNING (cause started)",
    ]
    assert describe_story(rec.story) == rec.describe()
    assert describe_story(()) == []


def test_describe_story_one_line() -> None:
    assert describe_story((0.0, 1, 13, "cancel")) == ["t=0 QUEUED->CANCELLED (cause cancel)"]
    assert describe_story((4.0, "gpu", 0.125, "shrink")) == [
        "t=4 allotment gpu -> 0.125 (cause shrink)"
    ]


_LEGAL = {
    (S.PENDING, S.QUEUED): "queue",
    (S.PENDING, S.REJECTED): "reject",
    (S.QUEUED, S.STARTING): "start",
    (S.QUEUED, S.RUNNING): "batch",
    (S.QUEUED, S.SUCCEEDED): "served",
    (S.STARTING, S.RUNNING): "started",
    (S.STARTING, S.QUEUED): "requeue",
    (S.RUNNING, S.QUEUED): "requeue",
    **{
        (S.QUEUED, t): "drop" for t in (S.CANCELLED, S.NODE_LOST, S.FAILED, S.REJECTED, S.TIMED_OUT)
    },
    **{
        (src, t): "end"
        for src in (S.STARTING, S.RUNNING)
        for t in (S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.NODE_LOST)
    },
}


def test_the_transition_table() -> None:
    assert records.TRANSITIONS == _LEGAL


@pytest.mark.parametrize("src", list(S), ids=lambda s: s.name)
def test_move_takes_exactly_the_legal_edges(src: Status) -> None:
    for dst in S:
        rec = ActionRecord(ActionSpec("a"), 0.0, 1)
        rec.status = src
        if (src, dst) in _LEGAL:
            rec.move(dst, 5.0, "why")
            assert rec.status is dst
            assert rec.story == (5.0, int(src), int(dst), "why")
        else:
            with pytest.raises(IllegalTransition):
                rec.move(dst, 5.0, "why")
            assert rec.status is src
            assert rec.story == ()


def test_an_illegal_move_names_the_action_the_edge_and_the_story() -> None:
    rec = ActionRecord(ActionSpec("act-9"), 0.0, 1)
    rec.move(S.QUEUED, 1.0, "arrived")
    rec.move(S.STARTING, 2.0, "placed")
    with pytest.raises(IllegalTransition) as info:
        rec.move(S.PENDING, 3.0, "back")
    e = info.value
    assert e.action_id == "act-9"
    assert e.story == ["t=1 PENDING->QUEUED (cause arrived)", "t=2 QUEUED->STARTING (cause placed)"]
    assert str(e) == (
        "action act-9: illegal transition STARTING -> PENDING; story:\n"
        "  t=1 PENDING->QUEUED (cause arrived)\n"
        "  t=2 QUEUED->STARTING (cause placed)"
    )
    assert rec.status is S.STARTING
    assert len(rec.story) == 8


# ---- node states ------------------------------------------------------------------------------


def _node() -> NodeState:
    return NodeState(NodeSpec("n1", Resources(cpu=8, memory_mb=1024, gpu=2, gpu_memory_mb=2000)))


def test_a_node_state_at_start() -> None:
    spec = NodeSpec("n1", Resources(cpu=8, memory_mb=1024, gpu=2, gpu_memory_mb=2000))
    n = NodeState(spec)
    cap = {"cpu": 8.0, "memory_mb": 1024.0, "gpu": 2.0, "gpu_memory_mb": 2000.0}
    assert n.spec is spec
    assert n.name == "n1"
    assert n.cap == cap
    assert n.used == {}
    assert n.free == cap and n.free is not n.cap
    assert n.alive is True
    assert n.running == set() and n.elastic == {}
    assert n.sessions == set() and n.instances == set()
    assert n.dev_free == {0, 1}
    assert n.warm == {}
    assert n.grown == 0
    assert n.per_device_memory() == {0: 1000.0, 1: 1000.0}
    cpu_only = NodeState(NodeSpec("c", Resources(cpu=4)))
    assert cpu_only.dev_free == set()
    assert cpu_only.per_device_memory() == {}


def test_take_adds_to_the_use_and_takes_from_the_free() -> None:
    n = _node()
    n.take(Resources(cpu=2, memory_mb=256))
    assert n.used == {"cpu": 2.0, "memory_mb": 256.0}
    assert n.free == {"cpu": 6.0, "memory_mb": 768.0, "gpu": 2.0, "gpu_memory_mb": 2000.0}
    n.take({"cpu": 1.5, "gpu": 1.0})  # a plain mapping too
    assert n.used == {"cpu": 3.5, "memory_mb": 256.0, "gpu": 1.0}
    assert n.free == {"cpu": 4.5, "memory_mb": 768.0, "gpu": 1.0, "gpu_memory_mb": 2000.0}
    n.take({"widgets": 1.0})  # a dimension the node lacks: free below 0
    assert n.used["widgets"] == 1.0
    assert n.free["widgets"] == -1.0
    assert n.grown == 0


def test_give_takes_from_the_use_down_to_zero() -> None:
    n = _node()
    n.take(Resources(cpu=3, memory_mb=512))
    n.give(Resources(cpu=1, memory_mb=512))
    assert n.used == {"cpu": 2.0, "memory_mb": 0.0}
    assert n.free == {"cpu": 6.0, "memory_mb": 1024.0, "gpu": 2.0, "gpu_memory_mb": 2000.0}
    assert n.grown == 1
    n.give({"cpu": 1.5})  # a plain mapping too
    assert n.used["cpu"] == 0.5
    assert n.free["cpu"] == 7.5
    assert n.grown == 2
    n.give({"cpu": 0.5})
    assert n.used["cpu"] == 0.0 and n.free["cpu"] == 8.0
    # float residue (0.1 + 0.2 - 0.1 - 0.2 is 2.8e-17) is kept as exactly 0.0
    n.take({"memory_mb": 0.1})
    n.take({"memory_mb": 0.2})
    n.give({"memory_mb": 0.1})
    n.give({"memory_mb": 0.2})
    assert n.used["memory_mb"] == 0.0 and n.free["memory_mb"] == 1024.0
    # more than was used is given back as none used (never below 0)
    n.give({"gpu": 0.5})
    assert n.used["gpu"] == 0.0 and n.free["gpu"] == 2.0
    # a dimension the node lacks, given back: none free there
    n.take({"widgets": 1.0})
    n.give({"widgets": 1.0})
    assert n.used["widgets"] == 0.0 and n.free["widgets"] == 0.0


def test_give_keeps_a_use_at_exactly_the_tolerance() -> None:
    n = _node()
    n.take({"cpu": 1e-9})
    n.give({"cpu": 0.0})
    assert n.used["cpu"] == 1e-9  # not under 1e-9: kept
    assert n.free["cpu"] == 8.0 - 1e-9
    n.give({"cpu": 5e-10})  # 5e-10 left: under it, none used
    assert n.used["cpu"] == 0.0 and n.free["cpu"] == 8.0


def test_fits_within_the_free_and_the_tolerance() -> None:
    n = _node()
    n.take(Resources(cpu=6))
    assert n.fits(Resources(cpu=2, memory_mb=1024)) is True
    assert n.fits({"cpu": 2.0 + 1e-9}) is True  # at the tolerance: fits
    assert n.fits({"cpu": 2.0 + 2e-9}) is False
    assert n.fits(Resources(cpu=2.5)) is False
    assert n.fits(Resources(cpu=1, memory_mb=1025)) is False
    assert n.fits({"widgets": 0.5}) is False  # a dimension the node lacks
    assert n.fits({"widgets": 1e-9}) is True
    assert n.fits({}) is True


# ---- sessions and model instances -------------------------------------------------------------


def test_a_session_record_at_request() -> None:
    demand = Resources(cpu=1, memory_mb=512)
    image = object()
    s = SessionRecord(
        "s1", demand, 300.0, 4.5, trajectory="traj", task="swe", warm_key="img", attachment=image
    )
    assert s.id == "s1"
    assert s.attachment is image
    assert s.demand is demand
    assert s.ttl_s == 300.0
    assert s.trajectory == "traj"
    assert s.task == "swe"
    assert s.warm_key == "img"
    assert s.node is None
    assert s.last_active == 4.5
    assert s.actions == set()
    assert s.charge is demand
    assert s.peak_mb == -1.0
    bare = SessionRecord("s2", demand, 60.0, 0.0)
    assert (bare.trajectory, bare.task, bare.warm_key, bare.attachment) == (None, None, None, None)


def test_an_instance_record_at_load() -> None:
    model = ModelSpec("rm", devices=2, memory_mb=1500.0)
    inst = InstanceRecord("i1", model, "g1", (2, 3))
    assert (int(InstState.LOADING), int(InstState.READY)) == (0, 1)
    assert inst.id == "i1"
    assert inst.model is model
    assert inst.node == "g1"
    assert inst.devices == (2, 3)
    assert inst.state is InstState.LOADING
    assert inst.batch is None
    assert inst.more == {}
    assert inst.last_used == 0.0
    assert inst.seqs() == 0
    h = inst.holding()
    assert type(h) is Resources
    assert dict(h) == {"gpu": 2.0, "gpu_memory_mb": 3000.0}


def test_an_instances_sequences_count_every_batch() -> None:
    inst = InstanceRecord("i1", ModelSpec("gen", max_seqs=16), "g1", (0,))
    inst.batch = ("b1", ("a", "b"))
    assert inst.seqs() == 2
    inst.more["b2"] = ("c",)
    assert inst.seqs() == 3
    inst.more["b3"] = ("d", "e", "f")
    assert inst.seqs() == 6
