"""Lent CPU taken back at once (issue 41 item 3; core/lending.py, docs/core.md "Tenants' fair
share"): a tenant below its share whose action does not fit squeezes the CPU quotas of the
running actions of tenants above theirs (never below `lend_floor` of their quota, at most
their excess), starts at its full demand, and the squeezed grow back first as capacity frees.
Exact commands, accounts and virtual times."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node, elastic
from fair_sim import simulate

from arl_tangram.core import CoreConfig
from arl_tangram.core import commands as C
from arl_tangram.core import events as ev
from arl_tangram.core.actions import Status

HALF = {"alice": 0.5, "carol": 0.5}



def _flooded(cpu: float = 2, n: int = 4, **cfg: object) -> Driver:
    # (the mechanics of a squeeze and a regrowth without anticipation, unless a test asks)
    cfg.setdefault("lend_anticipation_s", 0.0)
    d = Driver([cpu_node("n", cpu=cpu)], tenant_shares=HALF, **cfg)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(n)])
    return d


def test_an_owed_head_squeezes_the_lenders_and_starts_at_its_demand() -> None:
    d = _flooded()
    out = d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    # the lowered quotas go out before the start: the lender slows before the newcomer runs
    assert cpu_commands(out) == [("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    st = d.core.st
    assert st.tenant_use["carol"]["cpu"] == 1.0 and st.tenant_use["alice"]["cpu"] == 1.0
    assert st.nodes["n"].free["cpu"] == 0.0
    assert d.core.lending is not None and d.core.lending.taken_back == 1
    assert any("lent CPU taken back" in line for line in d.core.story("c0"))
    # alice now holds her share (1 of 2 cores): her next one waits, nothing more is squeezed
    assert cpu_commands(d.at(1.001).arrive(act("a1", tag="print", tenant="alice"))) == []


def test_the_squeezed_grow_back_first_and_a_squeeze_and_regrowth_cancel_out() -> None:
    d = _flooded()
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"), act("a1", tag="print", tenant="alice"))
    # a0 ends: c0, c1 grow back and are squeezed again for a1 in the same event: no resize
    assert cpu_commands(d.at(1.004).finish("a0")) == [("start", "a1", 1.0)]
    # a1 ends, alice has nothing queued: carol's two grow back; the node is full again, so
    # carol's queued c2 still waits
    assert cpu_commands(d.at(1.008).finish("a1")) == [("resize", "c0", 1.0), ("resize", "c1", 1.0)]
    assert d.core.lending is not None and d.core.lending.squeezed == {}
    assert d.core.st.tenant_use["carol"]["cpu"] == 2.0


def test_a_squeezed_actions_end_lets_its_squeezed_neighbour_grow_back() -> None:
    d = _flooded()
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    # c0 ends first: its 0.5 goes to c1 (squeezed, same tenant) before carol's queued c2
    assert cpu_commands(d.at(1.5).finish("c0")) == [("resize", "c1", 1.0)]
    assert d.core.st.tenant_use["carol"]["cpu"] == 1.0


def test_lend_floor_one_takes_nothing_back() -> None:
    d = _flooded(lend_floor=1.0)
    assert d.core.lending is None
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))) == []


def test_a_lender_keeps_its_floor() -> None:
    # 0.75 of one core each: two running loops can lend 0.5 of a core, not the one alice needs
    d = _flooded(lend_floor=0.75)
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))) == []
    # four running loops on four cores lend 0.25 each: exactly a core
    d = _flooded(cpu=4, n=6, lend_floor=0.75)
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))) == [
        ("resize", "c0", 0.75), ("resize", "c1", 0.75), ("resize", "c2", 0.75),
        ("resize", "c3", 0.75), ("start", "a0", 1.0)]


def test_the_longest_expected_lends_first() -> None:
    # c0 is expected to run 100 s, c1 1 s (hints): c1 keeps its core (SRPT), c0 gives 0.5,
    # then c1 gives what is still short
    from arl_tangram.core.actions import WorkHints

    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, lend_floor=0.25)
    d.at(0.0).arrive(act("c0", tag="loop", tenant="carol", hints=WorkHints(expected_s=100.0)),
                     act("c1", tag="loop", tenant="carol", hints=WorkHints(expected_s=1.0)))
    assert cpu_commands(d.at(0.5).arrive(act("a0", tag="print", tenant="alice"))) == [
        ("resize", "c0", 0.25), ("resize", "c1", 0.75), ("start", "a0", 1.0)]


def test_only_a_tenants_excess_is_lent_and_never_its_own_actions() -> None:
    # three tenants of equal weight on 3 cores: carol holds 2, bob 1 (his share), alice none:
    # alice takes her core from carol's excess only; bob's action keeps its quota
    shares = {"alice": 1.0, "bob": 1.0, "carol": 1.0}
    d = Driver([cpu_node("n", cpu=3)], tenant_shares=shares)
    d.at(0.0).arrive(act("c0", tag="l", tenant="carol"), act("c1", tag="l", tenant="carol"),
                     act("b0", tag="l", tenant="bob"), act("c2", tag="l", tenant="carol"))
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    # a second head of alice's is over her share (2 of 3 > 1/3): it waits
    assert cpu_commands(d.at(1.0).arrive(act("a1", tag="p", tenant="alice"))) == []


def test_memory_does_not_stretch() -> None:
    # carol's two loops hold the node's whole memory: nothing alice could squeeze frees it
    d = Driver([cpu_node("n", cpu=2, mem=1024)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", mem=512, tag="loop", tenant="carol") for i in range(3)])
    assert cpu_commands(d.at(1.0).arrive(act("a0", mem=256, tag="print", tenant="alice"))) == []


def test_elastic_actions_are_not_squeezed() -> None:
    # an elastic test lends by its own rule (elastic.reclaim), never by a quota squeeze
    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, policy="fifo")
    d.at(0.0).arrive(elastic("c0", lo=2, hi=2, tenant="carol"))
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))) == []


def test_the_short_tenant_runs_on_its_share_at_once_and_the_flooder_loses_only_its_work() -> None:
    # carol floods 2 cores with six 10 s loops at t=0; alice sends four 1 s actions at t=1
    arr = ([(0.0, act(f"c{i}", tag="loop", tenant="carol"), 10.0) for i in range(6)]
           + [(1.0, act(f"a{i}", tag="loop", tenant="alice"), 1.0) for i in range(4)])
    r = simulate([cpu_node("n", cpu=2)], arr, tenant_shares=HALF)
    # alice's four start at once on her share (one core), one after another: 1, 2, 3, 4
    assert [r.start[f"a{i}"] for i in range(4)] == [1.0, 2.0, 3.0, 4.0]
    assert r.act([f"a{i}" for i in range(4)]) == 2.5  # alone on her one-core share: 2.5 too
    # c0, c1 ran at half speed for alice's 4 s and the 20 ms her core stays held after her
    # last (anticipation): each 2.01 s late; carol's 60 s of work plus alice's 4 s on 2
    # cores end at 32 s (alone: 30 s), plus the hold's 10 ms
    assert (r.finish["c0"], r.finish["c1"]) == (12.01, 12.01)
    assert max(r.finish[f"c{i}"] for i in range(6)) == 32.01
    assert r.resizes == [(1.0, "c0", 0.5), (1.0, "c1", 0.5), (5.02, "c0", 1.0), (5.02, "c1", 1.0)]
    # without taking back, alice waits for a loop to end (t=10), the pass order as before
    w = simulate([cpu_node("n", cpu=2)], arr, tenant_shares=HALF, lend_floor=1.0)
    assert w.act([f"a{i}" for i in range(4)]) == 11.5 and w.resizes == []


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan")])
def test_a_bad_lend_floor_is_refused_naming_it(bad: float) -> None:
    with pytest.raises(ValueError, match=r"CoreConfig.lend_floor: must be in \(0, 1\], got "):
        CoreConfig(lend_floor=bad)


def test_a_sessions_owed_action_takes_back_on_its_sessions_node() -> None:
    # alice's session lives on n; carol's loops hold both cores; alice's action in her session
    # can only run there: it takes its share back from carol's loops on that node
    from arl_tangram.core import events as ev
    from arl_tangram.core.resources import Resources

    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, lend_anticipation_s=0.0)
    out = d(ev.SessionRequested(0.0, "s", Resources(memory_mb=256), 600.0))
    assert [c.node for c in out if isinstance(c, C.OpenSession)] == ["n"]
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    out = d.at(1.0).arrive(act("a0", tag="sh", tenant="alice", session="s"))
    assert cpu_commands(out) == [("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    assert [c.warm for c in out if isinstance(c, C.StartAction)] == [True]  # (its session's)
    # its end: carol's loops grow back, her queued c2 still waits (the node is full again)
    assert cpu_commands(d.at(2.0).finish("a0")) == [("resize", "c0", 1.0), ("resize", "c1", 1.0)]


def test_a_tenant_whose_memory_is_its_share_is_not_owed_cpu() -> None:
    # alice's running action holds half the node's memory (her share), one core of four: a
    # second action would pass her dominant share (memory), so nothing is squeezed for it
    d = Driver([cpu_node("n", cpu=4, mem=8192)], tenant_shares=HALF)
    d.at(0.0).arrive(act("a0", mem=4096, tag="big", tenant="alice"),
                     *[act(f"c{i}", mem=256, tag="loop", tenant="carol") for i in range(4)])
    assert d.core.st.tenant_use["alice"] == {"cpu": 1.0, "memory_mb": 4096.0}
    assert cpu_commands(d.at(1.0).arrive(act("a1", mem=256, tag="print", tenant="alice"))) == []


def test_a_lender_whose_excess_is_spent_gives_no_more() -> None:
    # 4.5 cores, three tenants of equal weight: 1.5 each. carol holds 2 (0.5 above), dave 2.5
    # (1.0 above). carol's c0 (longest) gives her 0.5 of excess; her c1 then gives nothing
    # though it could; dave's d0 gives the rest
    from arl_tangram.core.actions import WorkHints

    shares = {"alice": 1.0, "carol": 1.0, "dave": 1.0}
    d = Driver([cpu_node("n", cpu=4.5)], tenant_shares=shares)
    d.at(0.0).arrive(act("c0", tag="l", tenant="carol", hints=WorkHints(expected_s=100.0)),
                     act("c1", tag="l", tenant="carol", hints=WorkHints(expected_s=90.0)),
                     act("d0", cpu=2.5, tag="m", tenant="dave", hints=WorkHints(expected_s=10.0)))
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "d0", 2.0), ("start", "a0", 1.0)]


def test_an_action_of_a_session_not_open_yet_takes_nothing_back() -> None:
    # alice's session waits for room (carol's loops hold both cores); her action in it waits
    # with it: there is no node to take her share back on
    from arl_tangram.core import events as ev
    from arl_tangram.core.resources import Resources

    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    assert cpu_commands(d(ev.SessionRequested(0.5, "s", Resources(cpu=1, memory_mb=256), 600.0))) == []
    assert d.core.st.sessions["s"].node is None
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="sh", tenant="alice", session="s"))) == []


def test_a_tenant_holding_its_share_of_another_resource_is_not_owed_cpu() -> None:
    # alice's running action holds the node's one "gpu" (a dimension her next action does not
    # ask for): her dominant share is already past her half, so nothing is squeezed for her
    from arl_tangram.core.actions import ActionSpec
    from arl_tangram.core.cluster import NodeSpec
    from arl_tangram.core.resources import Resources

    node = NodeSpec("n", Resources(cpu=4, memory_mb=8192, gpu=1), pool="cpu")
    d = Driver([node], tenant_shares=HALF)
    d.at(0.0).arrive(ActionSpec("a0", demand=Resources(cpu=1, memory_mb=256, gpu=1), tag="g",
                                tenant="alice"),
                     *[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    assert d.core.st.tenant_use["alice"]["gpu"] == 1.0
    assert cpu_commands(d.at(1.0).arrive(act("a1", tag="print", tenant="alice"))) == []


# ---- anticipation (`lend_anticipation_s`) ----------------------------------------------------------
def _wakes(out) -> list[float]:
    return [round(c.time, 9) for c in out if isinstance(c, C.WakeAt)]


def test_a_held_share_starts_the_tenants_next_action_with_nothing_squeezed_or_regrown() -> None:
    d = _flooded(lend_anticipation_s=0.02)
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    out = d.at(1.004).finish("a0")
    # her core stays hers for 20 ms: carol's loops stay squeezed, a wake at its end
    assert cpu_commands(out) == [] and _wakes(out) == [1.024]
    lend = d.core.lending
    assert lend is not None
    node = d.core.st.nodes["n"]
    assert [(n, t, c, u) for n, (_, t, c, u) in lend.holds.items()] == [("n", "alice", 1.0, 1.024)]
    assert node.free["cpu"] == 0.0 and d.core.st.tenant_use["alice"].get("cpu", 0.0) == 0.0
    assert any("held for its tenant until 1.024" in line for line in d.core.story("a0"))
    # her next one (the answer's round trip later) starts on it: no squeeze, no regrowth
    out = d.at(1.006).arrive(act("a1", tag="print", tenant="alice"))
    assert cpu_commands(out) == [("start", "a1", 1.0)] and lend.holds == {}
    assert lend.taken_back == 2
    # carol's queued loop never got the held core, and her squeezed ones grow back only when
    # the last hold runs out
    out = d.at(1.010).finish("a1")
    assert cpu_commands(out) == [] and _wakes(out) == [1.030]
    assert cpu_commands(d.at(1.029).tick()) == []
    out = d(ev.Wake(1.030))
    assert cpu_commands(out) == [("resize", "c0", 1.0), ("resize", "c1", 1.0)]
    assert lend.holds == {} and lend.squeezed == {} and node.free["cpu"] == 0.0
    assert d.core.st.tenant_use["carol"]["cpu"] == 2.0
    assert d.status("c2") is Status.QUEUED


def test_a_hold_is_the_tenants_own_and_only_where_something_is_squeezed() -> None:
    d = _flooded(lend_anticipation_s=0.02)
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    d.at(1.004).finish("a0")
    # another tenant's action cannot start on alice's held core
    out = d.at(1.005).arrive(act("c9", tag="print", tenant="carol"))
    assert cpu_commands(out) == [] and d.status("c9") is Status.QUEUED
    # carol's loops end while the hold lasts: what they free goes to carol's queue as usual
    out = d.at(1.010).finish("c0")
    assert cpu_commands(out) == [("resize", "c1", 1.0)]  # (c1 grows back into c0's half)
    # without squeezed actions there, an owed action's end holds nothing
    d2 = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, lend_anticipation_s=0.02)
    d2.at(0.0).arrive(act("c0", tag="loop", tenant="carol"), act("c1", tag="loop", tenant="carol"))
    d2.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    d2.at(1.5).finish("c0")
    d2.at(1.6).finish("c1")
    out = d2.at(1.7).finish("a0")
    assert _wakes(out) == [] and d2.core.lending is not None and d2.core.lending.holds == {}


def test_without_anticipation_nothing_is_held() -> None:
    d = _flooded(lend_anticipation_s=0.0)
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    assert d.core.lending is not None and d.core.lending.started == set()  # (nothing to hold)
    out = d.at(1.004).finish("a0")
    assert _wakes(out) == [] and cpu_commands(out) == [("resize", "c0", 1.0), ("resize", "c1", 1.0)]
    assert d.core.lending is not None and d.core.lending.started == set()


def test_a_hold_taken_in_the_same_event_sends_no_wake() -> None:
    # a burst: her next action is queued when one ends, and starts on the hold at once
    d = _flooded(lend_anticipation_s=0.02)
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"), act("a1", tag="print", tenant="alice"))
    out = d.at(1.004).finish("a0")
    assert cpu_commands(out) == [("start", "a1", 1.0)] and _wakes(out) == []
    lend = d.core.lending
    assert lend is not None and lend.holds == {} and lend.wake == set()
    out = d.at(1.008).finish("a1")  # (her last: held, one wake)
    assert cpu_commands(out) == [] and _wakes(out) == [1.028]


def test_a_lost_nodes_hold_is_gone_with_it_and_its_return_is_fresh() -> None:
    d = _flooded(lend_anticipation_s=0.02)
    d.at(1.0).arrive(act("a0", tag="print", tenant="alice"))
    d.at(1.004).finish("a0")
    lend = d.core.lending
    assert lend is not None and set(lend.holds) == {"n"}
    d(ev.NodeLost(1.005, "n", "test"))
    assert lend.holds == {}
    # back (a fresh node; validated after each event): carol's two requeued loops take it all
    out = d(ev.NodeAdded(1.006, cpu_node("n", cpu=2)))
    assert cpu_commands(out) == [("start", "c0", 1.0), ("start", "c1", 1.0)]
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
    assert cpu_commands(d(ev.Wake(1.024))) == [] and lend.holds == {}


def test_a_hold_of_another_tenants_is_given_back_first_and_one_of_hers_grows() -> None:
    shares = {"alice": 1.0, "bob": 1.0, "carol": 1.0}
    d = Driver([cpu_node("n", cpu=3)], tenant_shares=shares, lend_floor=0.25)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(6)])
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"), act("a1", tag="p", tenant="alice"))
    assert cpu_commands(d.at(1.0).arrive(act("b0", tag="p", tenant="bob"))) == [
        ("resize", "c1", 0.25), ("resize", "c2", 0.5), ("start", "b0", 1.0)]
    assert [d.status(x) for x in ("a0", "a1", "b0")] == [Status.STARTING, Status.QUEUED,
                                                          Status.STARTING]
    lend = d.core.lending
    assert lend is not None
    # a0 ends: a1 (queued) takes its core in the same event
    assert cpu_commands(d.at(1.004).finish("a0")) == [("start", "a1", 1.0)] and lend.holds == {}
    out = d.at(1.006).finish("a1")  # alice's last: held for her
    assert cpu_commands(out) == [] and [(t, c) for _, t, c, _ in lend.holds.values()] == [
        ("alice", 1.0)]
    out = d.at(1.008).finish("b0")  # bob's: alice's hold goes back (to carol's squeezed), bob's is made
    assert [(t, c, u) for _, t, c, u in lend.holds.values()] == [("bob", 1.0, 1.028)]
    # (alice's core back to carol's squeezed loops: c0 0.25 -> 1, the least work left first,
    # c1 0.25 -> 0.5)
    assert cpu_commands(out) == [("resize", "c0", 1.0), ("resize", "c1", 0.5)]
    assert d.core.st.nodes["n"].free["cpu"] == 0.0


def test_two_of_her_actions_ends_add_up_in_one_hold_the_later_end_its_time() -> None:
    # 4 cores, carol's four loops: alice's share is 2, both her actions take a core back
    d = _flooded(cpu=4, n=6, lend_anticipation_s=0.02)
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"), act("a1", tag="p", tenant="alice"))
    assert [d.status(x) for x in ("a0", "a1")] == [Status.STARTING, Status.STARTING]
    lend = d.core.lending
    assert lend is not None
    assert cpu_commands(d.at(1.004).finish("a0")) == []
    out = d.at(1.010).finish("a1")
    assert cpu_commands(out) == [] and _wakes(out) == [1.030]
    assert [(t, c, u) for _, t, c, u in lend.holds.values()] == [("alice", 2.0, 1.030)]
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
    assert cpu_commands(d(ev.Wake(1.024))) == []  # (the first end's wake: held on to 1.030)
    assert len(cpu_commands(d(ev.Wake(1.030)))) == 4 and lend.holds == {}


def test_her_two_cores_held_start_an_action_of_two_and_another_tenants_hold_stays() -> None:
    d = _flooded(cpu=4, n=6, lend_anticipation_s=0.02)
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"), act("a1", tag="p", tenant="alice"))
    d.at(1.004).finish("a0")
    d.at(1.010).finish("a1")
    lend = d.core.lending
    assert lend is not None
    # an action of two cores starts on her two held ones: nothing squeezed
    out = d.at(1.012).arrive(act("a2", cpu=2, tag="p", tenant="alice"))
    assert cpu_commands(out) == [("start", "a2", 2.0)] and lend.holds == {}


def test_a_tenants_take_back_leaves_another_tenants_hold_alone() -> None:
    shares = {"alice": 1.0, "bob": 1.0, "carol": 1.0}
    d = Driver([cpu_node("n", cpu=4)], tenant_shares=shares, lend_floor=0.25)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(6)])
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))
    d.at(1.004).finish("a0")
    lend = d.core.lending
    assert lend is not None and [(t, c) for _, t, c, _ in lend.holds.values()] == [("alice", 1.0)]
    # bob is owed a core: he takes it from carol's excess; alice's held core stays hers
    out = d.at(1.005).arrive(act("b0", tag="p", tenant="bob"))
    assert [c for k, _, c in cpu_commands(out) if k == "start"] == [1.0]
    assert [(t, c) for _, t, c, _ in lend.holds.values()] == [("alice", 1.0)]
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
