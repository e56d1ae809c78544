"""core/checks.py's values (issue 43 item 2: the survivors of `make mutation` on it): each of
`Core.validate`'s invariants made to break alone on a sound core, and reported by its name with
its detail word for word (``invariant NAME broken: DETAIL``); the sound core (every step of the
`Driver`, which validates after each event) and a state just inside each tolerance are not.
Every spoil here edits the core's records behind its back, as a bug would."""

from __future__ import annotations

import dataclasses

import pytest
from core_helpers import Driver, act, cpu_node, elastic, gpu_node, of, reward

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Elasticity, Speedup, Status, WorkHints
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.resources import Resources

LONG = WorkHints(expected_s=100)


def _report(d: Driver, spoil) -> str | None:
    """What `validate` says once ``spoil(core, state)`` ran (None: nothing broken)."""
    spoil(d.core, d.core.st)
    try:
        d.core.validate()
    except AssertionError as exc:
        return str(exc)
    return None


def _inv(name: str, detail: str) -> str:
    return f"invariant {name} broken: {detail}"


# ---- the scenes (each validated sound at every event by the Driver) ----------------------------


def _base() -> Driver:
    """n0 (2 cores, 4,096 MB): session s (64 MB) on it, `a` (2 cores) running, `q` (2 cores)
    queued in its shape's queue, s's action `sq` queued in s's queue."""
    d = Driver([cpu_node("n0", cpu=2, mem=4096)])
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    d.at(0.1).arrive(act("a", cpu=2, mem=256, hints=LONG))
    d.at(0.2).arrive(act("q", cpu=2, mem=256))
    d.at(0.3).arrive(act("sq", cpu=1, mem=128, session="s"))
    st = d.core.st
    assert st.actions["a"].status is Status.STARTING and st.actions["a"].node == "n0"
    assert st.actions["q"].status is Status.QUEUED and st.actions["sq"].status is Status.QUEUED
    assert st.sessions["s"].node == "n0" and st.nodes["n0"].used == {"cpu": 2.0, "memory_mb": 320.0}
    return d


def _waiting() -> Driver:
    """n0 (2 cores, 1,024 MB) holds `a` (1,000 MB): session w (512 MB) waits for room with its
    action `wq` queued; `b`'s end runs a pass that files w under its shape."""
    d = Driver([cpu_node("n0", cpu=2, mem=1024)])
    d.at(0.0).arrive(act("a", cpu=1, mem=1000, hints=LONG), act("b", cpu=1, mem=10, hints=LONG))
    d(ev.SessionRequested(0.1, "w", Resources(memory_mb=512)))
    d.at(0.2).arrive(act("wq", cpu=1, mem=128, session="w"))
    d.at(0.3).finish("b")
    assert d.core.st.sessions["w"].node is None and d.core.sessions.pending == {"w": 1}
    assert list(d.core.sessions._entry) == ["w"]
    return d


def _two_nodes() -> Driver:
    """n0 and n1 (2 cores, 4,096 MB each): session s on n0 runs `sa` (1 core, 128 MB)."""
    d = Driver([cpu_node("n0", cpu=2, mem=4096), cpu_node("n1", cpu=2, mem=4096)])
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    d.at(0.1).arrive(act("sa", cpu=1, mem=128, session="s", hints=LONG))
    assert d.core.st.sessions["s"].node == "n0" and d.core.st.actions["sa"].node == "n0"
    return d


def _gpu() -> Driver:
    """g0 (2 GPUs), model `small` (knee 8): instance small#1 on device 0 runs a batch of r0..r7,
    r8 and r9 queue, small#2 loads on device 1."""
    small = ModelSpec("small", memory_mb=1000, alpha=0.02, beta=0.01, max_batch=64)
    d = Driver(
        [gpu_node("g0", gpus=2)],
        [small],
        policy="tangram",
        model_min_instances=0,
        model_prewarm=False,
    )
    out = d.arrive(*[reward(f"r{i}", "small") for i in range(10)])
    d(ev.ModelLoaded(1.0, of(out, cmd.LoadModel)[0].instance_id))
    p = d.core.planner
    assert sorted(p.instances) == ["small#1", "small#2"]
    assert p.instances["small#1"].batch == ("b1", tuple(f"r{i}" for i in range(8)))
    assert p.instances["small#2"].devices == (1,)
    return d


def _continuous() -> Driver:
    """g0 (1 GPU), a continuously batching model (4 sequences): gj#1 runs r0..r3, 6 queue."""
    m = ModelSpec("gj", kind="genjudge", max_seqs=4, memory_mb=1000)
    d = Driver(
        [gpu_node("g0", gpus=1)], [m], policy="tangram", model_min_instances=0, model_prewarm=False
    )
    out = d.arrive(*[reward(f"r{i}", "gj") for i in range(10)])
    d(ev.ModelLoaded(1.0, of(out, cmd.LoadModel)[0].instance_id))
    assert d.core.planner.instances["gj#1"].seqs() == 4
    return d


def _elastic(hi: float) -> Driver:
    """n0 (8 cores): elastic `e` (1..hi cores) runs alone."""
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram")
    d.at(0.0).arrive(elastic("e", lo=1, hi=hi, hints=LONG))
    return d


def _elastic_queued(session: bool) -> Driver:
    """n0 (4 cores) full with rigid `h`; elastic `f` (1..4) queued (in session s's queue when
    ``session``: h takes 3.5 cores then, 0.5 stay idle, below f's minimum)."""
    d = Driver([cpu_node("n0", cpu=4, mem=8192)], policy="tangram")
    if session:
        d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    d.at(0.0).arrive(act("h", cpu=3.5 if session else 4, hints=LONG))
    d.at(0.1).arrive(elastic("f", lo=1, hi=4, session="s" if session else None))
    assert d.core.st.actions["f"].status is Status.QUEUED
    return d


def _fair() -> Driver:
    """n0 (2 cores), tenants x and y: x's `a` and y's `b` run (1 core each, lent), y's `c` queued."""
    d = Driver(
        [cpu_node("n0", cpu=2, mem=8192)], policy="tangram", tenant_shares={"x": 1.0, "y": 1.0}
    )
    d.at(0.0).arrive(
        act("a", cpu=2, tenant="x", hints=LONG), act("b", cpu=1, tenant="y", hints=LONG)
    )
    d.at(0.1).arrive(act("c", cpu=1, tenant="y"))
    st = d.core.st
    assert st.tenant_use == {
        "x": {"cpu": 1.0, "memory_mb": 256.0},
        "y": {"cpu": 1.0, "memory_mb": 256.0},
    }
    assert st.actions["c"].status is Status.QUEUED
    return d


def _grow(node: str, cpu: float = 0.0, mem: float = 0.0):
    """A spoil: ``node``'s capacity (and free room) grows behind the core's back."""

    def spoil(core, st) -> None:
        n = st.nodes[node]
        for k, v in (("cpu", cpu), ("memory_mb", mem)):
            if v:
                n.cap[k] += v
                n.free[k] += v
        st.index.update(node, n.free)

    return spoil


def _set(obj_of, attr: str, value):
    return lambda core, st: setattr(obj_of(core, st), attr, value)


# ---- nodes ------------------------------------------------------------------------------------


def test_used_equals_what_is_held_within_a_millionth() -> None:
    assert (
        _report(_base(), lambda c, st: st.nodes["n0"].used.__setitem__("cpu", 2.0 + 5e-7)) is None
    )
    assert _report(
        _base(), lambda c, st: st.nodes["n0"].used.__setitem__("cpu", 2.0 + 2e-6)
    ) == _inv("used-equals-holdings", "n0.cpu: used 2.000002 vs holdings 2.0")
    assert _report(
        _base(), lambda c, st: st.nodes["n0"].used.__setitem__("cpu", 2.0 - 2e-6)
    ) == _inv("used-equals-holdings", "n0.cpu: used 1.999998 vs holdings 2.0")


def test_used_within_capacity_within_a_millionth() -> None:
    assert _report(_base(), lambda c, st: st.nodes["n0"].cap.__setitem__("cpu", 2.0 - 5e-7)) is None
    assert _report(
        _base(), lambda c, st: st.nodes["n0"].cap.__setitem__("cpu", 2.0 - 2e-6)
    ) == _inv("capacity", "n0.cpu: 2.0 > 1.999998")
    assert _report(_base(), lambda c, st: st.nodes["n0"].cap.pop("cpu")) == _inv(
        "capacity", "n0.cpu: 2.0 > 0.0"
    )


def test_running_sets_and_the_index() -> None:
    assert _report(_base(), lambda c, st: st.nodes["n0"].running.discard("a")) == _inv(
        "running-on-node", "a not in n0.running"
    )
    assert _report(_base(), lambda c, st: st.nodes["n0"].running.add("ghost")) == _inv(
        "running-set", "ghost on n0"
    )
    assert _report(_base(), lambda c, st: st.nodes["n0"].running.add("q")) == _inv(
        "running-set", "q on n0"
    )
    assert _report(_base(), lambda c, st: st.index.remove("n0")) == _inv(
        "index", "alive node n0 not indexed"
    )


def test_a_dead_node_is_not_checked_but_its_actions_are() -> None:
    """n1 (idle) dead with a spoiled ledger: nothing; n0 dead under `a`: a is not on an alive node."""

    def spoil(c, st) -> None:
        n1 = st.nodes["n1"]
        n1.alive = False
        n1.used["cpu"] = 99.0
        n1.running.add("ghost")
        st.index.remove("n1")

    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)])
    d.at(0.0).arrive(act("a", cpu=2, hints=LONG))
    assert _report(d, spoil) is None
    assert _report(_base(), _set(lambda c, st: st.nodes["n0"], "alive", False)) == _inv(
        "active-on-alive-node", "a on n0"
    )


# ---- actions and queues ------------------------------------------------------------------------


def test_every_arrival_is_delivered_once_or_live() -> None:
    assert _report(_base(), _set(lambda c, st: c, "arrived", 4)) == _inv(
        "one-deliver-each", "arrived 4 != delivered 0 + live 3"
    )


def test_a_live_action_s_status_and_queue() -> None:
    q = lambda c, st: st.actions["q"]  # noqa: E731
    assert _report(_base(), _set(q, "status", Status.SUCCEEDED)) == _inv(
        "live-not-finished", "q is SUCCEEDED"
    )
    assert _report(_base(), _set(q, "status", Status.PENDING)) == _inv(
        "no-pending-after-handle", "q"
    )
    assert _report(_base(), _set(q, "queue_key", None)) == _inv("queued-in-queue", "q")
    assert _report(
        _base(), lambda c, st: setattr(st.actions["q"], "gen", st.actions["q"].gen + 1)
    ) == _inv("queued-entry", "q")
    assert _report(
        _base(), lambda c, st: setattr(st.actions["a"], "queue_key", st.actions["q"].queue_key)
    ) == _inv("active-not-queued", "a")


def test_queue_counts_and_waiting_sessions() -> None:
    def more(c, st) -> None:
        c.queues.live[st.actions["q"].queue_key] = 2

    key = "shape(('cpu', 2.0), ('memory_mb', 256.0))"
    assert _report(_base(), more) == _inv(
        "queue-counts", f"{{{key!r}: 1, ('sess', 's'): 1}} vs {{{key!r}: 2, ('sess', 's'): 1}}"
    )
    assert _report(_base(), lambda c, st: c.queues.waiting_sessions.add("zz")) == _inv(
        "waiting-sessions", "['s'] vs ['s', 'zz']"
    )
    assert _report(_base(), lambda c, st: st.waiting_on["n0"].discard("s")) == _inv(
        "waiting-on-node", "s on n0"
    )
    assert _report(_waiting(), lambda c, st: st.sessions.pop("w")) == _inv(
        "waiting-session-known", "w"
    )


def test_provider_actions_stay_off_queues_and_nodes() -> None:
    assert _report(
        _base(), lambda c, st: setattr(c.providers, "check", lambda live: ["p: bad", "p: worse"])
    ) == _inv("providers", "p: bad")
    assert _report(
        _base(), lambda c, st: setattr(c.providers, "holds", lambda aid: aid == "a")
    ) == _inv("provider-action-off-nodes", "a")

    # a provider's action off queues and nodes is neither queued nor active, and the next is checked
    def held(c, st) -> None:
        st.actions["q"].queue_key = None
        c.providers.holds = lambda aid: aid == "q"
        st.actions["sq"].status = Status.SUCCEEDED

    assert _report(_base(), held) == _inv("live-not-finished", "sq is SUCCEEDED")


def test_a_batch_is_known_and_an_elastic_allotment_in_range() -> None:
    assert _report(_gpu(), _set(lambda c, st: st.actions["r0"], "batch", "bogus")) == _inv(
        "batch-known", "r0 batch bogus"
    )

    def bounds(lo: float, hi: float):
        return lambda c, st: setattr(
            st.actions["e"],
            "spec",
            dataclasses.replace(
                st.actions["e"].spec, elasticity=Elasticity(lo, hi, speedup=Speedup(0.9))
            ),
        )

    assert _report(_elastic(4), bounds(1, 3)) == _inv("allotment-in-range", "e: 4.0")
    assert _report(_elastic(4), bounds(5, 8)) == _inv("allotment-in-range", "e: 4.0")

    def above(c, st) -> None:  # (growable too: it may grow to 8 now)
        bounds(4 + 5e-7, 8)(c, st)
        c.elastic.placer.growable["n0"]["e"] = None

    assert _report(_elastic(4), above) is None
    assert _report(_elastic(4), bounds(1, 4 - 5e-7)) is None


# ---- sessions -----------------------------------------------------------------------------------


def test_the_session_sums_within_a_millionth() -> None:
    assert _report(
        _base(), lambda c, st: c.sessions.held.__setitem__("n0", Resources(memory_mb=65))
    ) == _inv("session-demand-sum", "n0: Resources(memory_mb=65) vs Resources(memory_mb=64)")
    assert (
        _report(
            _base(), lambda c, st: c.sessions.held.__setitem__("n0", Resources(memory_mb=64 + 5e-7))
        )
        is None
    )
    assert _report(_base(), lambda c, st: c.sessions.caps.__setitem__("n0", 65.0)) == _inv(
        "session-caps-sum", "n0: 65.0 vs 64.0"
    )
    assert _report(_base(), lambda c, st: c.sessions.caps.__setitem__("n0", 64.0 + 5e-7)) is None
    assert _report(_base(), lambda c, st: c.sessions.caps.pop("n0")) == _inv(
        "session-caps-sum", "n0: 0.0 vs 64.0"
    )


def test_a_session_s_charge_node_and_actions() -> None:
    def shrink(c, st) -> None:
        st.sessions["s"].demand = Resources(memory_mb=32)
        c.sessions.caps["n0"] = 32.0

    assert _report(_base(), shrink) == _inv(
        "session-charge-within-demand", "s: Resources(memory_mb=64) vs Resources(memory_mb=32)"
    )

    def off(c, st) -> None:
        st.nodes["n0"].sessions.discard("s")
        c.sessions.held["n0"] = Resources()
        c.sessions.caps["n0"] = 0.0

    assert _report(_base(), off) == _inv("session-on-node", "s")
    assert _report(_base(), lambda c, st: st.sessions["s"].actions.add("ghost")) == _inv(
        "session-action-live", "s: ghost"
    )

    def move(c, st) -> None:
        rec = st.actions["sa"]
        st.nodes["n0"].running.discard("sa")
        st.nodes["n1"].running.add("sa")
        rec.node = "n1"
        for k, v in rec.allotment.items():
            st.nodes["n0"].used[k] -= v
            st.nodes["n1"].used[k] = st.nodes["n1"].used.get(k, 0.0) + v

    assert _report(_two_nodes(), move) == _inv("session-node", "sa on n1, session on n0")


def test_the_spread_order_is_current_where_not_dirty() -> None:
    ranks = lambda c: c.sessions.ranks  # noqa: E731
    assert _report(_two_nodes(), lambda c, st: ranks(c).rank.__setitem__("n1", (9, 9))) == _inv(
        "spread-rank", "n1: (9, 9) vs (0.5, -2.0)"
    )
    assert _report(_two_nodes(), lambda c, st: ranks(c).heap.clear()) == _inv("spread-heap", "n1")

    def dirty(c, st) -> None:
        ranks(c).rank["n1"] = (9, 9)
        ranks(c).dirty["n1"] = None

    assert _report(_two_nodes(), dirty) is None


def test_the_sessions_waiting_for_room_are_filed_once_by_shape() -> None:
    sess = lambda c: c.sessions  # noqa: E731
    assert _report(_waiting(), lambda c, st: sess(c).pending.__setitem__("w", 99)) == _inv(
        "waiting-place", "w"
    )
    assert _report(
        _waiting(), lambda c, st: sess(c)._entry.__setitem__("w", ("x", sess(c)._entry["w"][1]))
    ) == _inv("waiting-shape", "w")
    assert _report(_waiting(), lambda c, st: sess(c)._entry.__setitem__("zz", ("x", 0))) == _inv(
        "waiting-gone", "zz"
    )
    assert _report(
        _waiting(), lambda c, st: [h.append(h[0]) for h in sess(c)._groups.values()]
    ) == _inv("waiting-once", "['w', 'w']")
    assert _report(_base(), lambda c, st: sess(c).pending.__setitem__("s", 5)) == _inv(
        "waiting-session", "s"
    )
    assert _report(_base(), lambda c, st: sess(c).pending.__setitem__("zz", 5)) == _inv(
        "waiting-session", "zz"
    )

    # (one whose shape is to be worked out again is not held to it)
    def stale(c, st) -> None:
        sess(c).pending["w"] = 99
        sess(c)._stale["w"] = None

    assert _report(_waiting(), stale) is None


def test_a_session_waits_only_where_nothing_has_room() -> None:
    assert _report(_waiting(), _grow("n0", mem=1000)) == _inv(
        "session-waits", "w could open on a node with room"
    )

    def reserved(c, st) -> None:
        _grow("n0", cpu=2)(c, st)
        st.reserved["n0"] = "q"

    assert _report(_base(), reserved) == _inv(
        "session-action-waits",
        "sq (Resources(cpu=1, memory_mb=128)) fits free {'cpu': 2.0, 'memory_mb': 3776.0} of n0",
    )
    assert _report(_elastic_queued(True), _grow("n0", cpu=2)) == _inv(
        "session-action-waits",
        "elastic f waits while n0 has idle CPU {'cpu': 2.5, 'memory_mb': 7872.0}",
    )
    assert (
        _report(_elastic_queued(True), _grow("n0", cpu=0.5 - 2e-9)) is None
    )  # idle: 1 core - 2e-9
    assert _report(_elastic_queued(True), _grow("n0", cpu=0.5 - 5e-10)) == _inv(
        "session-action-waits",
        "elastic f waits while n0 has idle CPU {'cpu': 0.9999999995, 'memory_mb': 7872.0}",
    )


# ---- work conservation --------------------------------------------------------------------------


def test_no_shared_pool_head_fits_an_alive_unreserved_node() -> None:
    assert _report(_base(), _grow("n0", cpu=2)) == _inv(
        "work-conserving",
        "q (Resources(cpu=2, memory_mb=256)) fits free {'cpu': 2.0, 'memory_mb': 3776.0} of n0",
    )
    assert _report(_elastic_queued(False), _grow("n0", cpu=2)) == _inv(
        "work-conserving", "elastic f waits while n0 has idle CPU {'cpu': 2.0, 'memory_mb': 7936.0}"
    )
    assert _report(_elastic_queued(False), _grow("n0", cpu=1 - 2e-9)) is None
    assert _report(_elastic_queued(False), _grow("n0", cpu=1 - 5e-10)) == _inv(
        "work-conserving",
        "elastic f waits while n0 has idle CPU {'cpu': 0.9999999995, 'memory_mb': 7936.0}",
    )


# ---- elastic sets -------------------------------------------------------------------------------


def test_the_elastic_registry_growable_set_and_derived_width() -> None:
    assert _report(_elastic(4), lambda c, st: st.nodes["n0"].elastic.clear()) == _inv(
        "elastic-registry", "e on n0"
    )
    assert _report(
        _elastic(4), lambda c, st: st.nodes["n0"].elastic.__setitem__("zz", st.actions["e"])
    ) == _inv("elastic-registry", "n0: ['e', 'zz'] registered, ['e'] run")
    e = lambda c, st: st.actions["e"]  # noqa: E731
    assert _report(_elastic(4), _set(e, "width", 3.0)) == _inv(
        "allotment-derived", "e: width 3.0, rate -1.0 at Resources(cpu=4, memory_mb=256)"
    )
    assert _report(_elastic(4), _set(e, "rate", 0.5)) == _inv(
        "allotment-derived", "e: width 4.0, rate 0.5 at Resources(cpu=4, memory_mb=256)"
    )
    assert _report(_elastic(16), lambda c, st: c.elastic.placer.growable.clear()) == _inv(
        "elastic-growable", "e on n0"
    )
    assert (
        _report(_elastic(4), lambda c, st: c.elastic.placer.growable.clear()) is None
    )  # at its maximum


# ---- model instances ----------------------------------------------------------------------------


def test_an_instance_s_node_and_devices() -> None:
    inst = lambda c, st: c.planner.instances["small#1"]  # noqa: E731
    assert _report(_gpu(), lambda c, st: st.nodes["g0"].instances.clear()) == _inv(
        "instance-on-node", "small#1"
    )
    assert _report(_gpu(), _set(inst, "devices", (0, 5))) == _inv(
        "one-nvlink-domain", "small#1: (0, 5)"
    )
    assert _report(_gpu(), lambda c, st: st.nodes["g0"].dev_free.add(0)) == _inv(
        "devices-held", "small#1"
    )
    assert _report(
        _gpu(), _set(lambda c, st: c.planner.instances["small#2"], "devices", (0,))
    ) == _inv("devices-exclusive", "small#1")


def test_an_instance_s_batches_and_sequences() -> None:
    assert _report(
        _gpu(), _set(lambda c, st: c.planner.instances["small#1"], "batch", None)
    ) == _inv("idle-instance-with-queue", "small#1")
    assert _report(
        _gpu(), lambda c, st: c.planner.instances["small#2"].more.__setitem__("b", ("r9",))
    ) == _inv("more-only-beside-batch", "small#2")
    gj = lambda c, st: c.planner.instances["gj#1"]  # noqa: E731
    assert _report(
        _continuous(), lambda c, st: setattr(gj(c, st), "batch", ("b1", ("r0", "r1", "r2")))
    ) == _inv("free-sequence-with-queue", "gj#1")
    assert _report(_continuous(), lambda c, st: gj(c, st).more.__setitem__("bx", ("r8",))) == _inv(
        "sequences-within-max", "gj#1"
    )


# ---- tenants ------------------------------------------------------------------------------------


def test_a_tenant_s_use_and_queue() -> None:
    assert _report(_fair(), lambda c, st: st.tenant_use["x"].__setitem__("cpu", 1.5)) == _inv(
        "tenant-use", "tenant 'x' cpu: use 1.5 vs holdings 1.0"
    )
    assert _report(_fair(), lambda c, st: st.tenant_use["x"].__setitem__("cpu", 1.0 + 5e-7)) is None
    assert _report(_fair(), lambda c, st: st.tenant_use.__setitem__("z", {"cpu": 1.0})) == _inv(
        "tenant-use", "tenant 'z' cpu: use 1.0 vs holdings 0.0"
    )
    assert _report(_fair(), _set(lambda c, st: st.actions["c"], "tenant", "x")) == _inv(
        "tenant-queue",
        "c of tenant 'x' queued in \"shape(('cpu', 1.0), ('memory_mb', 256.0))|tenant=y\"",
    )
    # without shares nobody's use is checked
    assert _report(_base(), lambda c, st: st.tenant_use.__setitem__("z", {"cpu": 1.0})) is None


@pytest.mark.parametrize("spoil", ["none"])
def test_the_scenes_are_sound(spoil: str) -> None:
    for make in (_base, _waiting, _two_nodes, _gpu, _continuous, _fair):
        assert _report(make(), lambda c, st: None) is None
    assert _report(_elastic(4), lambda c, st: None) is None
    assert _report(_elastic_queued(True), lambda c, st: None) is None


# ---- the view -----------------------------------------------------------------------------------


def test_the_view_of_nodes_sessions_and_counts() -> None:
    from arl_tangram.core.view import NodeView, SessionView

    d = _base()
    d.at(0.4).finish("a")
    d.core.st.nodes["n0"].free["cpu"] = -0.5  # (shown as 0: never below)
    v = d.core.view()
    assert (v.time, v.policy, v.instances, v.parked) == (0.4, "tangram", (), {})
    assert v.nodes == (
        NodeView(
            name="n0",
            pool="cpu",
            capacity=Resources(cpu=2, memory_mb=4096),
            used=Resources(cpu=2, memory_mb=320),
            free=Resources(cpu=0.0, memory_mb=3776),
            running=1,
            alive=True,
            warm={},
        ),
    )
    assert v.sessions == (
        SessionView(id="s", node="n0", demand=Resources(memory_mb=64), actions=1, last_active=0.3),
    )
    assert v.queued_by_kind == {"code": 1}
    assert v.counts == {"SUCCEEDED": 1, "STARTING": 1, "QUEUED": 1}


def test_the_view_of_instances_and_parked_models() -> None:
    from arl_tangram.core.view import InstanceView

    d = _gpu()
    p = d.core.planner
    p.parked[("g0", "small")] = 1
    p.parked[("g0", "gone")] = 0
    v = d.core.view()
    assert v.instances == (
        InstanceView(id="small#1", model="small", node="g0", devices=(0,), state="busy", queue=8),
        InstanceView(
            id="small#2", model="small", node="g0", devices=(1,), state="loading", queue=0
        ),
    )
    assert v.parked == {"g0/small": 1} and v.queued_by_kind == {"reward": 2}
    assert v.counts == {"RUNNING": 8, "QUEUED": 2}
    p.instances["small#1"].batch = None
    assert d.core.view().instances[0].state == "ready"
    assert d.core.view().instances[0].queue == 0


def test_the_view_lists_sessions_by_id() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=4096)])
    d(ev.SessionRequested(0.0, "b", Resources(memory_mb=64)))
    d(ev.SessionRequested(0.1, "a", Resources(memory_mb=32)))
    assert [(s.id, s.demand, s.actions) for s in d.core.view().sessions] == [
        ("a", Resources(memory_mb=32), 0),
        ("b", Resources(memory_mb=64), 0),
    ]


# ---- parked sessions (the scene of test_crowded_node_passes: a, b, c parked on n0) -------------


def _parked_scene() -> Driver:
    from test_crowded_node_passes import _parked

    d = _parked()
    assert sorted(d.core.st.parked) == ["a", "b", "c"] and d.core.st.parked["a"][1] == 3
    return d


def test_a_parked_session_waits_on_its_node() -> None:
    assert _report(_parked_scene(), lambda c, st: None) is None
    assert _report(
        _parked_scene(), lambda c, st: st.parked.__setitem__("zz", st.parked["a"])
    ) == _inv("parked-waits", "zz")

    def nodeless(c, st) -> None:  # (its charge gone from n0 too: only the parked check sees it)
        st.sessions["a"].node = None
        st.nodes["n0"].used["memory_mb"] -= 64

    assert _report(_parked_scene(), nodeless) == _inv("parked-waits", "a")
    assert (
        _report(_parked_scene(), lambda c, st: st.waiting_on.pop("n0")) is None
    )  # (parked: not in it)


def test_a_parked_session_s_head_and_group() -> None:
    import heapq

    from arl_tangram.core.queues import AGED

    shape = "(('cpu', 1.0), ('memory_mb', 2048.0))"
    assert _report(
        _parked_scene(), lambda c, st: st.parked.__setitem__("a", (st.parked["a"][0], -1))
    ) == _inv("parked-head", f"a: (48, 3, 1, 'qa') {shape}, parked with -1 {shape}")

    def aged(c, st) -> None:
        rec = st.actions["qa"]
        heapq.heappush(c.queues.heaps[("sess", "a")], (AGED, rec.seq, rec.gen, "qa"))

    assert _report(_parked_scene(), aged) == _inv(
        "parked-head", f"a: ({AGED}, 3, 1, 'qa') {shape}, parked with 3 {shape}"
    )
    other = "(('cpu', 1.0), ('memory_mb', 1536.0))"
    assert _report(
        _parked_scene(), lambda c, st: st.parked.__setitem__("a", (st.parked["c"][0], 3))
    ) == _inv("parked-head", f"a: (48, 3, 1, 'qa') {shape}, parked with 3 {other}")
    d = _parked_scene()
    first = next(iter(d.core.st.parked))  # (the order they were parked in)
    assert _report(d, lambda c, st: st.short_on.pop("n0")) == _inv("parked-in-its-group", first)
    assert _report(
        _parked_scene(), lambda c, st: st.short_on["n0"][(st.parked["a"][0], True)].heap.clear()
    ) == _inv("parked-in-its-group", "a")


# ---- more edges ---------------------------------------------------------------------------------


def test_a_dimension_used_but_not_held_and_held_but_not_used() -> None:
    assert _report(_base(), lambda c, st: st.nodes["n0"].used.__setitem__("gpu", 5.0)) == _inv(
        "used-equals-holdings", "n0.gpu: used 5.0 vs holdings 0.0"
    )
    assert _report(_base(), lambda c, st: st.nodes["n0"].used.pop("cpu")) == _inv(
        "used-equals-holdings", "n0.cpu: used 0.0 vs holdings 2.0"
    )
    # exactly a millionth off, where nothing is held nor offered: within both tolerances
    assert _report(_base(), lambda c, st: st.nodes["n0"].used.__setitem__("gpu", 1e-6)) is None


def test_a_dead_first_node_does_not_hide_the_next() -> None:
    def spoil(c, st) -> None:
        st.nodes["n0"].alive = False
        st.index.remove("n0")
        st.nodes["n1"].used["cpu"] = 1.0

    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)])
    d.tick()
    assert _report(d, spoil) == _inv("used-equals-holdings", "n1.cpu: used 1.0 vs holdings 0.0")


def test_tenant_use_of_a_dimension_or_a_tenant_missing() -> None:
    assert _report(
        _fair(), lambda c, st: st.tenant_use.__setitem__("x", {"memory_mb": 256.0})
    ) == _inv("tenant-use", "tenant 'x' cpu: use 0.0 vs holdings 1.0")
    assert _report(_fair(), lambda c, st: st.tenant_use.pop("x")) in {
        _inv("tenant-use", "tenant 'x' cpu: use 0.0 vs holdings 1.0"),
        _inv("tenant-use", "tenant 'x' memory_mb: use 0.0 vs holdings 256.0"),
    }
    assert _report(_fair(), lambda c, st: st.tenant_use.__setitem__("z", {"cpu": 1e-6})) is None


def test_a_tenant_s_use_sums_its_actions() -> None:
    d = Driver(
        [cpu_node("n0", cpu=4, mem=8192)], policy="tangram", tenant_shares={"x": 1.0, "y": 1.0}
    )
    d.at(0.0).arrive(
        act("a", cpu=1, tenant="x", hints=LONG), act("b", cpu=1, tenant="x", hints=LONG)
    )
    assert d.core.st.tenant_use == {"x": {"cpu": 2.0, "memory_mb": 512.0}}
    assert _report(d, lambda c, st: st.tenant_use["x"].__setitem__("cpu", 1.0)) == _inv(
        "tenant-use", "tenant 'x' cpu: use 1.0 vs holdings 2.0"
    )


def test_allotment_range_edges_are_inclusive() -> None:
    def bounds(lo: float, hi: float, grow: bool):
        def spoil(c, st) -> None:
            rec = st.actions["e"]
            rec.spec = dataclasses.replace(
                rec.spec, elasticity=Elasticity(lo, hi, speedup=Speedup(0.9))
            )
            if grow:
                c.elastic.placer.growable["n0"]["e"] = None

        return spoil

    assert _report(_elastic(4), bounds(4 + 1e-6, 8, True)) is None  # 4 + 1e-6 - 1e-6 == 4.0
    assert _report(_elastic(4), bounds(1, 4 - 1e-6, False)) is None  # 4 - 1e-6 + 1e-6 == 4.0


def test_an_elastic_action_within_a_core_of_its_maximum_is_growable() -> None:
    d = _elastic(8.5)
    assert d.core.st.actions["e"].allotment.get("cpu") == 8.0
    assert _report(d, lambda c, st: c.elastic.placer.growable.clear()) == _inv(
        "elastic-growable", "e on n0"
    )


def test_the_waiting_sessions_without_a_node_entry_and_sums_exactly_a_millionth_off() -> None:
    assert _report(_base(), lambda c, st: st.waiting_on.pop("n0")) == _inv(
        "waiting-on-node", "s on n0"
    )
    assert _report(_two_nodes(), lambda c, st: c.sessions.caps.__setitem__("n1", 1e-6)) == _inv(
        "session-caps-sum", "n1: 1e-06 vs 0"
    )
    assert _report(
        _two_nodes(), lambda c, st: c.sessions.held.__setitem__("n1", Resources(memory_mb=1e-6))
    ) == _inv("session-demand-sum", "n1: Resources(memory_mb=1e-06) vs Resources()")


def test_the_waiting_place_is_the_entry_s_place_not_its_version() -> None:
    def moved(c, st) -> None:
        sessions = c.sessions
        (heap,) = sessions._groups.values()
        heap[0] = (7, heap[0][1], "w")
        sessions.pending["w"] = 7

    assert _report(_waiting(), moved) is None


def test_an_idle_instance_without_a_queue_and_one_with_free_sequences() -> None:
    small = ModelSpec("small", memory_mb=1000, alpha=0.02, beta=0.01, max_batch=64)
    d = Driver(
        [gpu_node("g0", gpus=1)],
        [small],
        policy="tangram",
        model_min_instances=0,
        model_prewarm=False,
    )
    out = d.arrive(reward("r0", "small"))
    out = d(ev.ModelLoaded(1.0, of(out, cmd.LoadModel)[0].instance_id))
    (b,) = of(out, cmd.RunBatch)
    d(ev.BatchFinished(2.0, b.batch_id, b.instance_id, outputs={"r0": 1.0}))
    inst = d.core.planner.instances["small#1"]
    assert inst.batch is None and d.core.queues.live == {}
    assert _report(d, lambda c, st: None) is None

    m = ModelSpec("gj", kind="genjudge", max_seqs=4, memory_mb=1000)
    d = Driver(
        [gpu_node("g0", gpus=1)], [m], policy="tangram", model_min_instances=0, model_prewarm=False
    )
    out = d.arrive(reward("r0", "gj"), reward("r1", "gj"))
    d(ev.ModelLoaded(1.0, of(out, cmd.LoadModel)[0].instance_id))
    assert d.core.planner.instances["gj#1"].seqs() == 2 and d.core.queues.live == {}
    assert _report(d, lambda c, st: None) is None


def test_one_sequence_at_a_time_is_continuous_batching() -> None:
    m = ModelSpec("one", kind="genjudge", max_seqs=1, memory_mb=1000)
    d = Driver(
        [gpu_node("g0", gpus=1)], [m], policy="tangram", model_min_instances=0, model_prewarm=False
    )
    out = d.arrive(reward("r0", "one"), reward("r1", "one"))
    d(ev.ModelLoaded(1.0, of(out, cmd.LoadModel)[0].instance_id))
    inst = d.core.planner.instances["one#1"]
    assert inst.seqs() == 1
    assert _report(d, lambda c, st: setattr(inst, "batch", None)) == _inv(
        "free-sequence-with-queue", "one#1"
    )


def test_a_session_with_nothing_queued_does_not_hide_the_next() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=4096)])
    d(ev.SessionRequested(0.0, "e", Resources(memory_mb=32)))
    d(ev.SessionRequested(0.0, "s", Resources(memory_mb=64)))
    d.at(0.1).arrive(act("a", cpu=2, mem=256, hints=LONG))
    d.at(0.3).arrive(act("sq", cpu=1, mem=128, session="s"))

    def reserved(c, st) -> None:
        _grow("n0", cpu=2)(c, st)
        st.reserved["n0"] = "x"

    assert _report(d, reserved) == _inv(
        "session-action-waits",
        "sq (Resources(cpu=1, memory_mb=128)) fits free {'cpu': 2.0, 'memory_mb': 3744.0} of n0",
    )


# ---- an elastic head may wait for a node warm for it -------------------------------------------


def _three() -> Driver:
    """n0, n1, n2 (4 cores each) full with rigid h0..h2; elastic `f` (1..4, warm key "test")
    queued."""
    d = Driver([cpu_node(f"n{i}", cpu=4, mem=8192) for i in range(3)], policy="tangram")
    d.at(0.0).arrive(*[act(f"h{i}", cpu=4, hints=LONG) for i in range(3)])
    d.at(0.1).arrive(elastic("f", lo=1, hi=4))
    assert d.core.st.actions["f"].status is Status.QUEUED and d.core.st.actions["f"].wkey == "test"
    assert not d.core.st.resident
    return d


def _idle_n0(n0_warm: int = 0, n1_warm: int = 0):
    def spoil(c, st) -> None:
        _grow("n0", cpu=2)(c, st)
        for name, w in (("n0", n0_warm), ("n1", n1_warm)):
            if w:
                st.nodes[name].warm["test"] = w

    return spoil


def test_an_elastic_head_waits_for_a_warm_node_only_where_the_idle_one_is_cold() -> None:
    idle = _inv(
        "work-conserving", "elastic f waits while n0 has idle CPU {'cpu': 2.0, 'memory_mb': 7936.0}"
    )
    assert _report(_three(), _idle_n0()) == idle  # nobody warm for it
    assert _report(_three(), _idle_n0(n1_warm=1)) is None  # n1 warm, n0 cold: it waits for n1
    assert _report(_three(), _idle_n0(n0_warm=1, n1_warm=1)) == idle  # n0 warm too: no reason

    def reserved(c, st) -> None:
        _idle_n0()(c, st)
        st.reserved["n0"] = "x"

    assert _report(_three(), reserved) is None  # (held for an aged action)

    def short_of_memory(c, st) -> None:
        _idle_n0()(c, st)
        st.nodes["n0"].free["memory_mb"] = 0.0

    assert _report(_three(), short_of_memory) is None  # (idle CPU, but f fits nothing else there)


def test_a_fixed_width_elastic_action_is_not_in_the_elastic_registry() -> None:
    """min == max: nothing to grow or shrink, so it runs as a rigid one (`ActionRecord.elastic`)."""
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram")
    d.at(0.0).arrive(elastic("x", lo=2, hi=2, hints=LONG))
    assert d.core.st.actions["x"].elastic is False and d.core.st.nodes["n0"].elastic == {}
    assert _report(d, lambda c, st: None) is None


def test_a_waiting_session_is_weighed_with_its_largest_action() -> None:
    """n0 (1,024 MB) holds `a` (1,000 MB); w (512 MB) waits with `big` (1,020 MB, first) and
    `wq` (128 MB) queued. Grown by 500 MB, n0 has room for w and wq for good but not for w and
    big (`Sessions.room`): w rightly waits; grown by 510 MB, it has."""
    d = Driver([cpu_node("n0", cpu=2, mem=1024)])
    d.at(0.0).arrive(act("a", cpu=1, mem=1000, hints=LONG), act("b", cpu=1, mem=10, hints=LONG))
    d(ev.SessionRequested(0.1, "w", Resources(memory_mb=512)))
    d.at(0.2).arrive(act("big", cpu=1, mem=1020, session="w"))
    d.at(0.21).arrive(act("wq", cpu=1, mem=128, session="w"))
    d.at(0.3).finish("b")
    assert d.core.st.sessions["w"].node is None and d.core.st.nodes["n0"].free["memory_mb"] == 24.0
    assert _report(d, _grow("n0", mem=500)) is None
    assert _report(d, _grow("n0", mem=10)) == _inv(
        "session-waits", "w could open on a node with room"
    )
