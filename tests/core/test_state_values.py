"""core/state.py's values (issue 43 item 2: the survivors of `make mutation` on it): a fresh
`CoreState` (every table empty, the clock at 0, the policy's switches, the tenants' weights and
the default weight, the least of them), sessions parked for memory (their groups by shape and
rigidity, the heap in the queues' order, compaction past exactly 2 x kept + 32 entries keeping
the live ones, the first live entry taken, a session put back in its node's set), an event's
clock, cause and command list, the capacity facts (largest and total capacity of the alive
nodes, cached until `capacity_changed`), the tenants' dominant shares over their weights and
their use (at or under 1e-9 kept as 0.0), a shape's share, whether a demand fits some node, and
an action's expected work."""

from __future__ import annotations

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.estimator import DurationEstimator
from arl_tangram.core.nodeindex import FreeIndex
from arl_tangram.core.policies import POLICY_TABLE
from arl_tangram.core.records import ActionRecord, NodeState, SessionRecord
from arl_tangram.core.resources import Resources
from arl_tangram.core.state import CoreState, ParkedGroup, largest_capacity

SPECS = (
    NodeSpec("n1", Resources(cpu=4, memory_mb=1000)),
    NodeSpec("n2", Resources(cpu=8, memory_mb=500, gpu=1)),
)


def state(config: CoreConfig | None = None, models: tuple[ModelSpec, ...] = ()) -> CoreState:
    st = CoreState(ClusterSpec(SPECS, models), config or CoreConfig())
    for s in SPECS:
        st.nodes[s.name] = NodeState(s)
    return st


# ---- a fresh state ---------------------------------------------------------------------------


def test_a_fresh_state() -> None:
    cfg = CoreConfig()
    st = CoreState(ClusterSpec(SPECS), cfg)
    assert st.config is cfg
    assert st.policy is POLICY_TABLE["tangram"]
    assert st.cluster.nodes == SPECS
    assert st.models == {}
    assert st.nodes == {} and st.actions == {} and st.sessions == {}
    assert st.waiting_on == {} and st.parked == {} and st.short_on == {}
    assert st.now == 0.0 and st.out == [] and st.cause == ""
    assert st.start_index == {} and st.dirty == set() and st.touched == set()
    assert st.models_touched == set() and st.expand_at == set() and st.elastic_nodes == set()
    assert st.reserved == {} and st.fits_some == {} and st.shares == {}
    assert st._largest is None and st._total is None
    assert st.elastic_policy is True and st.partitioned is False and st.resident is False
    assert st.fair is False and st.tenant_weights == {} and st.default_weight == 1.0
    assert st.tenant_use == {}
    assert type(st.estimator) is DurationEstimator
    assert type(st.index) is FreeIndex


def test_the_policy_switches() -> None:
    st = CoreState(ClusterSpec(SPECS), CoreConfig(policy="trajectory-bound"))
    assert st.policy is POLICY_TABLE["trajectory-bound"]
    assert st.elastic_policy is False and st.partitioned is True and st.resident is True
    st = CoreState(ClusterSpec(SPECS), CoreConfig(policy="fifo"))
    assert st.elastic_policy is False and st.partitioned is False and st.resident is False


def test_the_models_by_name() -> None:
    m = ModelSpec("rm")
    st = CoreState(ClusterSpec(SPECS, (m,)), CoreConfig())
    assert st.models == {"rm": m}


def test_tenant_weights_and_the_default_the_least() -> None:
    st = CoreState(ClusterSpec(SPECS), CoreConfig(tenant_shares={"a": 3.0, "b": 0.5}))
    assert st.fair is True
    assert st.tenant_weights == {"a": 3.0, "b": 0.5}
    assert st.default_weight == 0.5
    assert st.tenant_weight("a") == 3.0
    assert st.tenant_weight("b") == 0.5
    assert st.tenant_weight("zzz") == 0.5
    plain = state()
    assert plain.tenant_weight("a") == 1.0


# ---- parked sessions ---------------------------------------------------------------------------

SHAPE = (("cpu", 1.0), ("memory_mb", 300.0))
OTHER = (("cpu", 2.0), ("memory_mb", 300.0))


def opened(st: CoreState, sid: str, node: str = "n1") -> None:
    s = SessionRecord(sid, Resources(cpu=1), 60.0, 0.0)
    s.node = node
    st.sessions[sid] = s
    st.waiting_on.setdefault(node, set()).add(sid)


def test_a_parked_head_goes_into_its_group() -> None:
    st = state()
    opened(st, "s1")
    opened(st, "s2")
    st.park("s1", "n1", SHAPE, 300.0, True, 5, 7)
    assert st.parked == {"s1": (SHAPE, 7)}
    assert st.waiting_on == {"n1": {"s2"}}
    assert list(st.short_on) == ["n1"]
    assert list(st.short_on["n1"]) == [(SHAPE, True)]
    g = st.short_on["n1"][(SHAPE, True)]
    assert type(g) is ParkedGroup
    assert (g.need, g.rigid, g.heap, g.kept) == (300.0, True, [(5, 7, "s1")], 0)
    st.park("s2", "n1", SHAPE, 999.0, True, 2, 9)
    assert g.heap[0] == (2, 9, "s2") and len(g.heap) == 2
    assert g.need == 300.0  # the group's, from its first head
    assert st.waiting_on == {"n1": set()}
    # another shape or rigidity: another group
    opened(st, "s3")
    opened(st, "s4")
    st.park("s3", "n1", SHAPE, 300.0, False, 1, 1)
    st.park("s4", "n1", OTHER, 300.0, True, 1, 2)
    assert list(st.short_on["n1"]) == [(SHAPE, True), (SHAPE, False), (OTHER, True)]
    assert st.short_on["n1"][(SHAPE, False)].rigid is False
    assert st.short_on["n1"][(SHAPE, False)].heap == [(1, 1, "s3")]


def test_a_fresh_group() -> None:
    g = ParkedGroup(12.5, False)
    assert (g.need, g.rigid, g.heap, g.kept) == (12.5, False, [], 0)


def test_the_heap_is_compacted_past_2_kept_plus_32_entries() -> None:
    st = state()
    for i in range(40):
        opened(st, f"s{i:02}")
    for i in range(32):
        st.park(f"s{i:02}", "n1", SHAPE, 300.0, True, i, i)
    g = st.short_on["n1"][(SHAPE, True)]
    assert len(g.heap) == 32 and g.kept == 0
    # half of them stale: unparked, parked again with another head, or moved to another node
    for i in range(0, 32, 2):
        if i % 6 == 0:
            st.unpark(f"s{i:02}")
        elif i % 6 == 2:
            st.parked[f"s{i:02}"] = (SHAPE, 1000 + i)
        else:
            st.sessions[f"s{i:02}"].node = "n2"
    st.park("s32", "n1", SHAPE, 300.0, True, 32, 32)  # 33 entries: compacted
    live = sorted([(i, i, f"s{i:02}") for i in range(1, 32, 2)] + [(32, 32, "s32")])
    assert g.heap == live and g.kept == 17
    # the next compaction past 2 x 17 + 32 = 66 entries: 49 stale entries more
    for j in range(49):
        st.unpark("s33")
        opened(st, "s33")
        st.park("s33", "n1", SHAPE, 300.0, True, 100 + j, 100 + j)
    assert len(g.heap) == 66 and g.kept == 17
    st.park("s34", "n1", SHAPE, 300.0, True, 200, 200)
    assert g.kept == 19
    assert g.heap == sorted([*live, (148, 148, "s33"), (200, 200, "s34")])


def test_the_first_live_entry_is_taken_the_stale_dropped() -> None:
    st = state()
    for sid in ("a", "b", "c", "d"):
        opened(st, sid)
    st.park("a", "n1", SHAPE, 300.0, True, 1, 1)
    st.park("b", "n1", SHAPE, 300.0, True, 2, 2)
    st.park("c", "n1", SHAPE, 300.0, True, 3, 3)
    st.park("d", "n1", SHAPE, 300.0, True, 4, 4)
    g = st.short_on["n1"][(SHAPE, True)]
    st.unpark("a")
    st.parked["b"] = (OTHER, 2)  # parked with another head's shape: stale
    assert st.next_parked("n1", SHAPE, g) == (3, 3, "c")
    assert g.heap == [(4, 4, "d")]
    del st.sessions["d"]  # closed
    assert st.next_parked("n1", SHAPE, g) is None
    assert g.heap == []
    assert st.next_parked("n1", SHAPE, g) is None


def test_an_entry_is_live_only_parked_with_that_head_on_that_node() -> None:
    st = state()
    opened(st, "s")
    st.park("s", "n1", SHAPE, 300.0, True, 1, 5)
    assert st._parked_here("s", SHAPE, 5, "n1") is True
    assert st._parked_here("s", SHAPE, 6, "n1") is False
    assert st._parked_here("s", OTHER, 5, "n1") is False
    assert st._parked_here("s", SHAPE, 5, "n2") is False
    assert st._parked_here("x", SHAPE, 5, "n1") is False
    st.parked["x"] = (SHAPE, 5)  # parked, but no such session
    assert st._parked_here("x", SHAPE, 5, "n1") is False


def test_unpark_puts_the_session_back_in_its_node_set() -> None:
    st = state()
    opened(st, "s")
    st.park("s", "n1", SHAPE, 300.0, True, 1, 1)
    assert st.waiting_on["n1"] == set()
    st.unpark("s")
    assert st.parked == {} and st.waiting_on["n1"] == {"s"}
    # not parked: nothing changes
    st.waiting_on["n1"].clear()
    st.unpark("s")
    assert st.waiting_on["n1"] == set()
    # parked, its session gone or not on a node: only unparked
    st.parked["gone"] = (SHAPE, 1)
    st.unpark("gone")
    assert st.parked == {} and st.waiting_on == {"n1": set()}
    s = SessionRecord("w", Resources(cpu=1), 60.0, 0.0)
    st.sessions["w"] = s
    st.parked["w"] = (SHAPE, 1)
    st.unpark("w")
    assert st.parked == {} and st.waiting_on == {"n1": set()}


# ---- the event in progress -----------------------------------------------------------------


def test_an_event_clock_cause_and_commands() -> None:
    st = state()
    out = st.begin(5.0, "arrive a")
    assert out == [] and st.out is out
    assert st.now == 5.0 and st.cause == "arrive a"
    st.start_index["a"] = 0
    out2 = st.begin(3.0, "late")
    assert st.now == 5.0 and st.cause == "late"  # the clock never goes back
    assert out2 is not out and st.out is out2
    assert st.start_index == {}
    kept = st.start_index
    st.begin(7.5, "x")
    assert st.start_index is kept and st.now == 7.5
    st.recause("y")
    assert st.cause == "y"
    st.out.append("cmd")  # type: ignore[arg-type]
    st.end()
    assert st.out == [] and st.cause == "y"


# ---- capacity facts ------------------------------------------------------------------------


def test_the_largest_capacity_of_the_alive_nodes_cached() -> None:
    st = state()
    first = st.largest()
    assert first == {"cpu": 8.0, "memory_mb": 1000.0, "gpu": 1.0}
    assert st.largest() is first and st._largest is first
    st.nodes["n2"].alive = False
    assert st.largest() is first  # until the capacity changes
    st.capacity_changed()
    assert st._largest is None
    assert st.largest() == {"cpu": 4.0, "memory_mb": 1000.0}
    assert largest_capacity([]) == {}
    assert largest_capacity([NodeState(NodeSpec("h", Resources(cpu=0.5)))]) == {"cpu": 0.5}


def test_the_total_capacity_of_the_alive_nodes_cached() -> None:
    st = state()
    first = st.total()
    assert first == {"cpu": 12.0, "memory_mb": 1500.0, "gpu": 1.0}
    assert st.total() is first and st._total is first
    st.nodes["n1"].alive = False
    assert st.total() is first
    st.capacity_changed()
    assert st._total is None
    assert st.total() == {"cpu": 8.0, "memory_mb": 500.0, "gpu": 1.0}


def test_capacity_changed_drops_every_fact() -> None:
    st = state()
    st.fits_some["k"] = True
    st.shares["k"] = 0.5  # type: ignore[index]
    st.largest()
    st.total()
    st.capacity_changed()
    assert st.fits_some == {} and st.shares == {} and st._largest is None and st._total is None


# ---- tenants -------------------------------------------------------------------------------


def test_a_tenants_rank_is_its_dominant_share_over_its_weight() -> None:
    st = CoreState(ClusterSpec(SPECS), CoreConfig(tenant_shares={"a": 2.0, "b": 0.5}))
    for s in SPECS:
        st.nodes[s.name] = NodeState(s)
    assert st.tenant_rank("a") == 0.0  # nothing held
    st.tenant_take("a", {"cpu": 3.0, "memory_mb": 750.0}, 1.0)
    # cpu 3/12, memory 750/1500: 0.5 over 2.0
    assert st.tenant_rank("a") == 0.25
    st.tenant_take("b", {"cpu": 6.0, "memory_mb": 150.0}, 1.0)
    assert st.tenant_rank("b") == 1.0  # 6/12 over 0.5
    st.tenant_take("c", {"cpu": 1.5, "gpu": 1.0}, 1.0)
    assert st.tenant_rank("c") == 2.0  # gpu 1/1 over the default 0.5
    # a dimension no node has does not count
    st.tenant_take("d", {"tpu": 4.0, "cpu": 0.6}, 1.0)
    assert st.tenant_rank("d") == (0.6 / 12.0) / 0.5
    st.tenant_take("a", {"cpu": 3.0, "memory_mb": 750.0}, -1.0)
    assert st.tenant_use["a"] == {"cpu": 0.0, "memory_mb": 0.0}
    assert st.tenant_rank("a") == 0.0


def test_a_tenants_use_at_or_under_1e_9_is_zero() -> None:
    st = state()
    st.tenant_take("t", {"cpu": 2e-9}, 1.0)
    assert st.tenant_use == {"t": {"cpu": 2e-9}}
    st.tenant_take("t", {"cpu": 1e-9}, -1.0)
    assert st.tenant_use == {"t": {"cpu": 0.0}}
    st.tenant_take("t", {"cpu": 1.0}, 2.0)
    assert st.tenant_use == {"t": {"cpu": 2.0}}
    st.tenant_take("t", {"cpu": 0.5, "gpu": 1.0}, -1.0)
    assert st.tenant_use == {"t": {"cpu": 1.5, "gpu": 0.0}}
    st.tenant_take("t", {"memory_mb": 1.0}, 0.5)
    assert st.tenant_use == {"t": {"cpu": 1.5, "gpu": 0.0, "memory_mb": 0.5}}


# ---- shares, fits, expected work -------------------------------------------------------------


def test_a_shapes_share_against_the_largest_cached() -> None:
    st = state()
    rec = ActionRecord(ActionSpec("a", demand=Resources(cpu=2, memory_mb=250)), 0.0, 1)
    assert st.share_of(rec) == 0.25  # cpu 2/8, memory 250/1000
    assert st.shares == {rec.skey: 0.25}
    st.shares[rec.skey] = 0.9
    assert st.share_of(rec) == 0.9
    other = ActionRecord(ActionSpec("b", demand=Resources(cpu=2, memory_mb=250)), 0.0, 2)
    assert st.share_of(other) == 0.9  # the same shape


def test_fits_some_node_cached_per_key() -> None:
    st = state()
    assert st.fits_some_node(Resources(cpu=6), "k6") is True
    assert st.fits_some == {"k6": True}
    assert st.fits_some_node(Resources(cpu=6, memory_mb=600), "k66") is False
    assert st.fits_some_node(Resources(cpu=2, memory_mb=600), "k2") is True
    st.nodes["n2"].alive = False
    assert st.fits_some_node(Resources(cpu=6), "k6") is True  # cached
    assert st.fits_some_node(Resources(cpu=6), "other") is False
    assert st.fits_some_node(Resources(cpu=1), "one") is True
    st.fits_some["fake"] = False
    assert st.fits_some_node(Resources(cpu=1), "fake") is False


def test_expected_work_the_estimators_mean_else_the_estimate() -> None:
    st = state()
    spec = ActionSpec("a", tag="ew-values")
    rec = ActionRecord(spec, 0.0, 1)
    rec.ekey, rec.units = DurationEstimator.work_of(spec)
    rec.est = 7.5
    assert st.expected_work(rec) == 7.5
    for run_s in (1.0, 2.0, 3.0):
        st.estimator.observe(spec, run_s)
    assert st.expected_work(rec) == 2.0
    rec.est = 0.0
    assert st.expected_work(rec) == 2.0
