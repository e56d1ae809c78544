"""Tenants' fair share (issue 41 item 3, docs/core.md "Tenants' fair share"): with
`CoreConfig.tenant_shares`, each free slot goes to the tenant with the least dominant share of
what is in use over its weight (DRF), inside a tenant in the policy's order; capacity a tenant
leaves idle is lent. Exact dispatch orders of small cases. The pass's own order is pinned with
``lend_floor=1.0`` (nothing running is squeezed: a lent core comes back as its action ends);
taking lent CPU back at once (the default) is tests/core/test_lending.py's."""

from __future__ import annotations

import re

import pytest
from core_helpers import Driver, act, cpu_node, elastic
from fair_sim import simulate

from arl_tangram.core import CoreConfig
from arl_tangram.core import commands as C
from arl_tangram.core.actions import ActionSpec, Status, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources

HALF = {"alice": 0.5, "carol": 0.5}


def _flood_and_short(n_long: int = 6, long_s: float = 10.0, n_short: int = 4,
                     short_s: float = 1.0, carol_kw: dict | None = None) -> list:
    """carol floods a 2-core node with ``n_long`` actions at t=0; alice sends ``n_short`` of
    the same kind (same estimator key: today they queue FIFO behind carol's) at t=1."""
    kw = carol_kw or {}
    return ([(0.0, act(f"c{i}", tag="loop", tenant="carol", **kw), long_s) for i in range(n_long)]
            + [(1.0, act(f"a{i}", tag="loop", tenant="alice"), short_s) for i in range(n_short)])


def test_without_shares_the_short_tenant_waits_for_the_whole_flood() -> None:
    r = simulate([cpu_node("n", cpu=2)], _flood_and_short())
    assert r.starts == ["c0", "c1", "c2", "c3", "c4", "c5", "a0", "a1", "a2", "a3"]
    assert r.act(["a0", "a1", "a2", "a3"]) == 30.5


def test_equal_shares_alternate_freed_cores_and_lend_what_is_idle() -> None:
    r = simulate([cpu_node("n", cpu=2)], _flood_and_short(), tenant_shares=HALF, lend_floor=1.0)
    # t=10: c0 ends -> alice (holds nothing) gets it; c1 ends -> carol (1 of 2 cores over 0.5
    # against alice's 1 of 2) ties on share, her head ranks first (same class, earlier arrival)
    # -> c2; alice keeps one core until her four are done; then carol takes both again
    assert r.starts == ["c0", "c1", "a0", "c2", "a1", "a2", "a3", "c3", "c4", "c5"]
    assert [r.start[a] for a in ("a0", "a1", "a2", "a3")] == [10.0, 11.0, 12.0, 13.0]
    assert r.act(["a0", "a1", "a2", "a3"]) == 11.5
    # work-conserving: at t=0 carol took both cores (alice idle), and after alice's last
    # action both are carol's: c3 at 14 (alice's core), c4 at 20, c5 at 24
    assert [r.start[c] for c in ("c0", "c1", "c3", "c4", "c5")] == [0.0, 0.0, 14.0, 20.0, 24.0]


def test_a_flooders_weight_and_hints_reorder_only_its_own_actions() -> None:
    gaming = {"weight": 1e300, "hints": WorkHints(expected_s=0.001)}
    plain = simulate([cpu_node("n", cpu=2)], _flood_and_short(), tenant_shares=HALF, lend_floor=1.0)
    r = simulate([cpu_node("n", cpu=2)], _flood_and_short(carol_kw=gaming), tenant_shares=HALF,
                 lend_floor=1.0)
    # her heads rank first on ties now (c2 before a1 as before), but never past alice's share
    assert r.starts == plain.starts
    assert r.act(["a0", "a1", "a2", "a3"]) == 11.5


def test_weights_split_the_cores_in_proportion() -> None:
    # 4 cores, shares 3:1, both tenants always backlogged with 1 s actions of one kind
    arr = ([(0.0, act(f"x{i}", tag="w", tenant="x"), 1.0) for i in range(30)]
           + [(0.0, act(f"y{i}", tag="w", tenant="y"), 1.0) for i in range(30)])
    r = simulate([cpu_node("n", cpu=4)], arr, tenant_shares={"x": 3.0, "y": 1.0}, lend_floor=1.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        running = [a for a in r.starts if r.start[a] == t]
        assert sorted(a[0] for a in running) == ["x", "x", "x", "y"], (t, running)
    # x's actions arrive first and take the idle node (lent: y has none queued yet); at
    # t=1, as the four end one by one: y0 (y holds 0 < x's 3/4 / 3), then x4, x5, x6 (x's
    # 2/4 / 3 = 1/6 < y's 1/4)
    assert r.starts[:8] == ["x0", "x1", "x2", "x3", "y0", "x4", "x5", "x6"]


def test_an_idle_tenants_share_is_lent_and_taken_back_by_order() -> None:
    # carol alone: both cores are hers (lent); without taking back (lend_floor 1.0) alice's
    # arrival squeezes nothing, and takes the next core to free
    arr = ([(0.0, act(f"c{i}", tag="loop", tenant="carol"), 4.0) for i in range(4)]
           + [(1.0, act("a0", tag="loop", tenant="alice"), 1.0)])
    r = simulate([cpu_node("n", cpu=2)], arr, tenant_shares=HALF, lend_floor=1.0)
    assert r.starts == ["c0", "c1", "a0", "c2", "c3"]
    assert (r.start["a0"], r.start["c2"], r.start["c3"]) == (4.0, 4.0, 5.0)


def test_dominant_resource_fairness_across_dimensions() -> None:
    # 4 cores, 4096 MB, held whole by b's action until t=1. x asks 1 core + 256 MB
    # (cpu-dominant: 1/4 each); y 0.5 core + 1024 MB (memory-dominant: 1/4 each). At t=1 one
    # pass serves the lower dominant share first, ties to the earlier head: x0, y0 (0 < 1/4),
    # x1 (1/4 = 1/4), y1 (1/4 < 2/4), x2 (2/4 = 2/4); then no core is left for y2's half.
    node = NodeSpec("n", Resources(cpu=4, memory_mb=4096), pool="cpu")
    arr = ([(0.0, act("b0", cpu=4, mem=4096, tag="b", tenant="b"), 1.0)]
           + [(0.5, act(f"x{i}", tag="x", tenant="x"), 1.0) for i in range(8)]
           + [(0.5, act(f"y{i}", cpu=0.5, mem=1024, tag="y", tenant="y"), 1.0) for i in range(8)])
    r = simulate([node], arr, tenant_shares={"x": 1.0, "y": 1.0, "b": 1.0})
    assert [a for a in r.starts if r.start[a] == 1.0] == ["x0", "y0", "x1", "y1", "x2"]
    # today: arrival order x0..x3 (4 cores), y's wait for x's cores
    base = simulate([node], arr)
    assert [a for a in base.starts if base.start[a] == 1.0] == ["x0", "x1", "x2", "x3"]


def test_one_tenant_with_shares_decides_exactly_as_without() -> None:
    nodes = [cpu_node("n1", cpu=4), cpu_node("n2", cpu=2)]
    arr = []
    for i in range(40):
        spec = (elastic(f"e{i}", 1, 3, tenant="solo") if i % 5 == 0
                else act(f"r{i}", cpu=1 + (i % 2), tag=f"t{i % 3}", tenant="solo"))
        arr.append((i * 0.3, spec, 1.0 + (i * 7 % 5)))
    base = simulate(nodes, arr)
    fair = simulate(nodes, arr, tenant_shares={"solo": 1.0})
    assert fair.stream == base.stream


def test_sessions_and_elastic_actions_keep_their_invariants_under_shares() -> None:
    d = Driver([cpu_node("n", cpu=4)], tenant_shares=HALF)
    d.at(0).arrive(elastic("e0", 1, 4, tenant="carol"), act("c1", tenant="carol"),
                   act("a1", tenant="alice", session="s"))
    d.at(1).arrive(act("a2", tenant="alice"), act("c2", tenant="carol"))
    for aid in ("e0", "c1", "a1", "a2", "c2"):
        if d.status(aid) is not None and aid not in d.delivered:
            d.at(2).finish(aid, run_s=1)
    assert d.core.st.tenant_use.get("carol", {}).get("cpu", 0.0) == 0.0


@pytest.mark.parametrize("bad, field", [({"a": -1.0}, "tenant_shares['a']"),
                                        ({"a": 0}, "tenant_shares['a']"),
                                        ({"a": float("nan")}, "tenant_shares['a']"),
                                        ({}, "tenant_shares"),
                                        ({1: 1.0}, "tenant_shares")])
def test_a_bad_share_is_refused_naming_it(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"CoreConfig.{field}")):
        CoreConfig(tenant_shares=bad)


def test_a_tenant_not_named_weighs_the_smallest_share() -> None:
    d = Driver([cpu_node("n", cpu=2)], tenant_shares={"alice": 0.5, "carol": 0.25})
    st = d.core.st
    assert (st.tenant_weight("alice"), st.tenant_weight("bob"), st.tenant_weight("")) == (0.5, 0.25, 0.25)
    out = d.at(0).arrive(act("b0", tenant="bob"), act("x0"))
    assert [c.action.id for c in out if isinstance(c, C.StartAction)] == ["b0", "x0"]
    assert st.tenant_rank("bob") == 0.5 / 0.25 and st.tenant_rank("") == 0.5 / 0.25


@pytest.mark.parametrize("policy", ["tangram", "fifo", "task-isolated", "static-pool"])
def test_seeded_random_walks_with_tenants(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """test_core_stateful's 100 seeded walks of 80 events, every action of one of three tenants
    (one unnamed), shares 2:1: every invariant after each event (the tenants' use included),
    and everything drains at the end."""
    import test_core_stateful as sm

    class Fair(sm.CoreMachine):
        def __init__(self) -> None:
            super().__init__()
            self.d = Driver(sm.NODES, sm.MODELS, policy=policy, trajectories=3, aging_s=20.0,
                            task_shares={"a": 2, "b": 1}, model_idle_s=15.0, session_ttl_s=30.0,
                            tenant_shares={"t0": 2.0, "t1": 1.0})

        def arrive_cpu(self, kw, dt) -> None:  # type: ignore[no-untyped-def]
            super().arrive_cpu({**kw, "tenant": ("t0", "t1", None)[self.n % 3]}, dt)

        def arrive_reward(self, model, idem) -> None:  # type: ignore[no-untyped-def]
            from arl_tangram.core.actions import ActionKind

            self.d.arrive(ActionSpec(self._new_id(), kind=ActionKind.REWARD, model=model,
                                     demand=Resources(), idempotent=idem,
                                     hints=WorkHints(tokens=50), tenant=("t0", "t1")[self.n % 2]))

    monkeypatch.setattr(sm, "_machine", lambda p: Fair)
    sm.test_seeded_random_walks(policy)


def _call(aid: str, tenant: str, provider: str = "p") -> ActionSpec:
    from arl_tangram.core.actions import ActionKind

    return ActionSpec(aid, kind=ActionKind.SEARCH, tag=provider, demand=Resources(),
                      payload={"query": aid}, tenant=tenant)


def _provider_order(shares: dict | None) -> list[str]:
    """A provider of 2 slots: carol sends 6 calls at 0, alice 2 at 0.1; each call is answered
    1 s after it was sent, in the order sent. The order the calls are sent in."""
    from arl_tangram.core import events as ev
    from arl_tangram.core.providers import ProviderLimits

    kw = {"tenant_shares": shares} if shares else {}
    d = Driver([cpu_node("n0")], providers=(ProviderLimits(name="p", rate=100.0, burst=10.0,
                                                          concurrency=2),), **kw)
    sent: list[tuple[float, str]] = []

    def note(out: list) -> None:
        sent.extend((d.t, c.action.id) for c in out if isinstance(c, C.CallProvider))

    note(d.at(0.0).arrive(*(_call(f"c{i}", "carol") for i in range(6))))
    note(d.at(0.1).arrive(_call("a0", "alice"), _call("a1", "alice")))
    done = 0
    while done < len(sent):
        t, aid = sent[done]
        done += 1
        note(d.at(max(d.t, t + 1.0))(ev.ActionFinished(max(d.t, t + 1.0), aid,
                                                          status=Status.SUCCEEDED, run_s=1.0)))
    return [a for _, a in sent]


def test_provider_slots_are_shared_by_tenant() -> None:
    # today: one order, carol's calls first (same kind, earlier)
    assert _provider_order(None) == ["c0", "c1", "c2", "c3", "c4", "c5", "a0", "a1"]
    # shares: at t=1 c0 ends -> alice (0 in flight) gets the slot; c1 ends -> carol (0) vs
    # alice (1): carol; then alice's a1 when a0 ends, carol's in between
    assert _provider_order(HALF) == ["c0", "c1", "a0", "c2", "a1", "c3", "c4", "c5"]


def _batch_order(shares: dict | None, alice: str = "alice") -> list[tuple[str, ...]]:
    """One reward-model instance, batches of at most 2: carol sends 6 actions at 0.5 s, alice
    2 at 0.6 s; each batch ends 1 s after it starts. The batches, in order."""
    from core_helpers import gpu_node, of, reward

    from arl_tangram.core import events as ev
    from arl_tangram.core.cluster import ModelSpec

    rm = ModelSpec("rm", kind="scalar", memory_mb=1000, alpha=1.0, beta=0.0, max_batch=2,
                   max_instances=1, load_s=0.0)
    kw = {"tenant_shares": shares} if shares else {}
    d = Driver([gpu_node("g0", gpus=1)], [rm], stagger_batches=False, **kw)
    for ld in of(d.at(0.0).tick(), C.LoadModel):
        d(ev.ModelLoaded(0.0, ld.instance_id))
    got: list = []
    got += of(d.at(0.5).arrive(*(reward(f"c{i}", tenant="carol") for i in range(6))), C.RunBatch)
    got += of(d.at(0.6).arrive(*(reward(f"a{i}", tenant=alice) for i in range(2))), C.RunBatch)
    done = 0
    while done < len(got):
        b = got[done]
        done += 1
        d.t += 1.0
        got += of(d(ev.BatchFinished(d.t, b.batch_id, b.instance_id,
                                     outputs={a.id: 1.0 for a in b.actions})), C.RunBatch)
    return [tuple(a.id for a in b.actions) for b in got]


def test_model_batches_are_shared_by_tenant() -> None:
    # today: one order (arrival, same work): carol's six, then alice's
    assert _batch_order(None) == [("c0",), ("c1", "c2"), ("c3", "c4"), ("c5", "a0"), ("a1",)]
    # shares (cost 1000 / 0.5 = 2000 an action): c0 left carol at 2000; alice's tag (0) is
    # least: a0, her tag then from carol's 2000 to 4000; c1 (2000 < 4000): carol's from 4000
    # to 6000; next batch a1 (4000 < 6000), c2; then carol's alone
    assert _batch_order(HALF) == [("c0",), ("a0", "c1"), ("a1", "c2"), ("c3", "c4"), ("c5",)]
    # one tenant with a share: its own order, as without shares
    assert _batch_order(HALF, alice="carol") == _batch_order(None, alice="carol")
