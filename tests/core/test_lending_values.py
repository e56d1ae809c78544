"""core/lending.py's values (issue 43 item 2: the survivors of `make mutation` on it): which
lender gives first (most expected work left, counting the time it has run), how much it may
give (its floor of its *first* quota, its tenant's excess), which node a head takes back on,
where the lowered quotas go in the commands, the story lines, and the squeezed growing back
(least work left first) -- exact commands, in order."""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_commands, cpu_node

from arl_tangram.core import commands as C
from arl_tangram.core.actions import ActionSpec, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources

HALF = {"alice": 0.5, "carol": 0.5}



def _hint(s: float) -> WorkHints:
    return WorkHints(expected_s=s)


def test_the_lender_with_most_work_left_gives_first_counting_its_run_time_and_regrows_last() -> None:
    # carol on 3 cores (floor 0.25): cA (10 s, from t=0), cC (3 s, from t=0), and cB (8 s),
    # which starts at t=5 when f ends. At t=6 work left: cB 7 s, cA 4 s, cC -3 s: cB gives
    # first, cA the rest (by expected work alone, or its run time added, cA would be first)
    d = Driver([cpu_node("n", cpu=3)], tenant_shares=HALF, lend_floor=0.25,
               lend_anticipation_s=0.0)  # (its regrowth at the end, not held)
    d.at(0.0).arrive(act("cA", tag="l", tenant="carol", hints=_hint(10.0)),
                     act("f", tag="l", tenant="carol", hints=_hint(5.0)),
                     act("cC", tag="l", tenant="carol", hints=_hint(3.0)),
                     act("cB", tag="l", tenant="carol", hints=_hint(8.0)))
    assert cpu_commands(d.at(5.0).finish("f")) == [("start", "cB", 1.0)]
    out = d.at(6.0).arrive(act("a0", cpu=1.5, tag="p", tenant="alice"))
    assert cpu_commands(out) == [("resize", "cB", 0.25), ("resize", "cA", 0.25), ("start", "a0", 1.5)]
    # every resize names its node and the event's cause (the start's)
    start = next(c for c in out if isinstance(c, C.StartAction))
    assert {(c.node, c.cause) for c in out if isinstance(c, C.ResizeAction)} == {("n", start.cause)}
    assert start.cause is not None
    # cC ends at t=7 (1 core): the least work left grows first: cA (3 s) to its core, cB
    # (6 s) gets the last 0.25; cB stays squeezed
    assert cpu_commands(d.at(7.0).finish("cC")) == [("resize", "cA", 1.0), ("resize", "cB", 0.5)]
    lending = d.core.lending
    assert lending is not None and set(lending.squeezed["n"]) == {"cB"}
    # a0 ends: cB grows back to its core
    assert cpu_commands(d.at(8.0).finish("a0")) == [("resize", "cB", 1.0)]
    assert lending.squeezed == {} and lending.full == {} and lending.sent == {}
    assert d.core.st.tenant_use["carol"]["cpu"] == 2.0
    assert [s for s in d.core.story("cB") if "cpu quota" in s] == [
        "t=6 cpu quota -> 0.25 (lent CPU taken back) (cause ActionArrived:a0)",
        "t=7 cpu quota -> 0.5 (grown back) (cause ActionFinished:cC)",
        "t=8 cpu quota -> 1 (grown back) (cause ActionFinished:a0)"]


def test_a_later_lender_with_more_work_left_gives_before_an_earlier_one() -> None:
    # c0 (1 s) arrived before c1 (100 s): c1 gives first although c0 is older
    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, lend_floor=0.25)
    d.at(0.0).arrive(act("c0", tag="l", tenant="carol", hints=_hint(1.0)),
                     act("c1", tag="l", tenant="carol", hints=_hint(100.0)))
    assert cpu_commands(d.at(0.5).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c1", 0.25), ("resize", "c0", 0.75), ("start", "a0", 1.0)]


def test_a_lenders_floor_is_of_its_first_quota_and_of_quotas_above_one_core() -> None:
    # two 2-core loops with floor 0.5 each give 1 core (not 2 - 0.5 / 2)
    d = Driver([cpu_node("n", cpu=4)], tenant_shares=HALF)
    d.at(0.0).arrive(act("c0", cpu=2, tag="l", tenant="carol"), act("c1", cpu=2, tag="l", tenant="carol"),
                     act("c2", cpu=2, tag="l", tenant="carol"))
    assert cpu_commands(d.at(1.0).arrive(act("a0", cpu=2, tag="p", tenant="alice"))) == [
        ("resize", "c0", 1.0), ("resize", "c1", 1.0), ("start", "a0", 2.0)]


def test_a_second_take_back_in_a_later_event_squeezes_others_and_lowers_before_its_start() -> None:
    # 4 loops on 4 cores: a0 squeezes c0, c1 to their floor (0.5); a1, later, cannot squeeze
    # them below it: c2, c3 give; their lowered quotas go out before a1's start
    d = Driver([cpu_node("n", cpu=4)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    assert cpu_commands(d.at(2.0).arrive(act("a1", tag="p", tenant="alice"))) == [
        ("resize", "c2", 0.5), ("resize", "c3", 0.5), ("start", "a1", 1.0)]
    lending = d.core.lending
    assert lending is not None and lending.taken_back == 2
    assert lending.full == {f"c{i}": 1.0 for i in range(4)}
    assert lending.sent == {f"c{i}": 0.5 for i in range(4)}
    assert d.core.story("a1")[-1] == (
        "t=2 started on CPU its tenant's share took back (cause ActionArrived:a1)")


def test_two_take_backs_in_one_event_lower_every_quota_before_the_first_start() -> None:
    # (the heads' warm key is the lenders': no warm-pool command comes first, the lowered
    # quotas go at the very start of the event's commands)
    d = Driver([cpu_node("n", cpu=4)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    out = d(_both(1.0, act("a0", tag="loop", tenant="alice"), act("a1", tag="loop", tenant="alice")))
    assert [type(c) for c in out] == [C.ResizeAction] * 4 + [C.StartAction] * 2
    assert cpu_commands(out) == [("resize", "c0", 0.5), ("resize", "c1", 0.5), ("resize", "c2", 0.5),
                          ("resize", "c3", 0.5), ("start", "a0", 1.0), ("start", "a1", 1.0)]
    assert d.core.lending is not None and d.core.lending.taken_back == 2


def _both(t: float, *specs: ActionSpec):
    from arl_tangram.core import events as ev

    return ev.ActionsArrived(t, tuple(specs))


def test_a_squeeze_and_a_regrowth_that_cancel_send_nothing_and_a_raise_goes_after_the_start() -> None:
    # a0 (1 core) squeezed c0, c1 to 0.5; alice's a1 (0.5) waits (she holds her share). a0
    # ends: c0, c1 grow back, then a1 squeezes c0 again (0.5): c0's quota is unchanged (no
    # resize), c1's raise goes out after a1's start (without anticipation; with it, below)
    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF, lend_anticipation_s=0.0)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"),
                                  act("a1", cpu=0.5, tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    assert cpu_commands(d.at(2.0).finish("a0")) == [("start", "a1", 0.5), ("resize", "c1", 1.0)]



def test_what_a_held_core_leaves_over_grows_back_the_least_work_left_first() -> None:
    # as above with the hold (the default 20 ms): a1 starts on a0's held core and needs half
    # of it; the other half grows back at once (nothing idles), c0 first (equal work: seq)
    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF)
    assert d.core.st.config.lend_anticipation_s == 0.02
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"), act("a1", cpu=0.5, tag="p", tenant="alice"))
    out = d.at(2.0).finish("a0")
    assert cpu_commands(out) == [("start", "a1", 0.5), ("resize", "c0", 1.0)]
    assert [c for c in out if isinstance(c, C.WakeAt)] == []
    lend = d.core.lending
    assert lend is not None and lend.holds == {} and set(lend.squeezed["n"]) == {"c1"}
    assert d.core.st.nodes["n"].free["cpu"] == 0.0


def test_a_node_with_some_free_cpu_is_squeezed_only_for_the_rest() -> None:
    # 2.5 cores, two loops running: 0.5 free; a0 (1 core) takes only 0.5 from c0
    d = Driver([cpu_node("n", cpu=2.5)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("start", "a0", 1.0)]
    lending = d.core.lending
    assert lending is not None and lending.squeezed == {"n": {"c0": lending.squeezed["n"]["c0"]}}
    # c0, the node's only squeezed action, ends: the node is forgotten with it
    assert cpu_commands(d.at(2.0).finish("c0")) == []
    assert lending.squeezed == {} and lending.full == {} and lending.sent == {}


def test_the_node_with_most_free_cpu_is_taken_back_on_ties_to_the_first() -> None:
    # n0: memory full (skipped); n1, n2: no CPU free; n3: 0.5 free. a0 goes to n3 (most
    # free), squeezing only 0.5 there; without n3, to n1 (the first of the ties)
    def cluster(with_n3: bool) -> Driver:
        nodes = [cpu_node("n0", cpu=2, mem=512), cpu_node("n1", cpu=2), cpu_node("n2", cpu=2)]
        if with_n3:
            nodes.append(cpu_node("n3", cpu=2.5))
        d = Driver(nodes, tenant_shares=HALF)
        loops = [act(f"m{i}", mem=512, tag="big", tenant="carol") for i in range(1)]
        loops += [act(f"c{i}", tag="loop", tenant="carol") for i in range(7 if with_n3 else 5)]
        d.at(0.0).arrive(*loops)
        return d

    d = cluster(True)
    where = {c.action.id: c.node for c in d.log if isinstance(c, C.StartAction)}
    assert where["m0"] == "n0"
    out = d.at(1.0).arrive(act("a0", mem=512, tag="p", tenant="alice"))
    got = [(c.action.id, c.node) for c in out if isinstance(c, C.StartAction)]
    assert got == [("a0", "n3")]
    resized = [(c.action_id, c.node, c.allotment.get("cpu")) for c in out if isinstance(c, C.ResizeAction)]
    assert len(resized) == 1 and resized[0][1:] == ("n3", 0.5)
    d = cluster(False)
    out = d.at(1.0).arrive(act("a0", mem=512, tag="p", tenant="alice"))
    assert [(c.action.id, c.node) for c in out if isinstance(c, C.StartAction)] == [("a0", "n1")]
    assert {c.node for c in out if isinstance(c, C.ResizeAction)} == {"n1"}


def test_a_lenders_budget_is_its_excess_over_an_entitlement_that_counts_the_asker() -> None:
    # 6 cores, three tenants of weight 1 (2 each). alice holds 0.5 and asks 1 more: carol
    # (2.5, 0.5 above) gives 0.5 from c0, her c1 nothing more; dave (3, 1.0 above) the rest.
    # (W counts alice, who holds CPU, once: W = 3)
    shares = {"alice": 1.0, "carol": 1.0, "dave": 1.0}
    d = Driver([cpu_node("n", cpu=6)], tenant_shares=shares)
    d.at(0.0).arrive(act("a0", cpu=0.5, tag="h", tenant="alice", hints=_hint(500.0)),
                     act("c0", tag="l", tenant="carol", hints=_hint(100.0)),
                     act("c1", tag="l", tenant="carol", hints=_hint(90.0)),
                     act("c2", cpu=0.5, tag="m", tenant="carol", hints=_hint(80.0)),
                     act("d0", cpu=3, tag="d", tenant="dave", hints=_hint(10.0)))
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
    assert cpu_commands(d.at(1.0).arrive(act("a1", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "d0", 2.5), ("start", "a1", 1.0)]


def test_a_heavier_lenders_entitlement_is_its_own_weight() -> None:
    # 6 cores, carol weight 2, alice and dave 1 (W = 4): carol is entitled to 3, dave to 1.5.
    # carol holds 3.5 (0.5 above), dave 2.5 (1.0 above): c0 gives 0.5, then dave the rest
    shares = {"alice": 1.0, "carol": 2.0, "dave": 1.0}
    d = Driver([cpu_node("n", cpu=6)], tenant_shares=shares)
    d.at(0.0).arrive(act("c0", cpu=2, tag="l", tenant="carol", hints=_hint(100.0)),
                     act("c1", cpu=1.5, tag="k", tenant="carol", hints=_hint(90.0)),
                     act("d0", cpu=2.5, tag="d", tenant="dave", hints=_hint(10.0)))
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))) == [
        ("resize", "c0", 1.5), ("resize", "d0", 2.0), ("start", "a0", 1.0)]


def test_a_tenant_holding_no_cpu_is_no_lender() -> None:
    # bob holds a GPU and no CPU (no "cpu" in his use): he lends nothing, carol does
    shares = {"alice": 1.0, "bob": 1.0, "carol": 1.0}
    node = NodeSpec("n", Resources(cpu=3, memory_mb=8192, gpu=1), pool="cpu")
    d = Driver([node], tenant_shares=shares)
    d.at(0.0).arrive(ActionSpec("b0", demand=Resources(memory_mb=256, gpu=1), tag="g", tenant="bob"),
                     *[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    assert d.core.st.tenant_use["bob"] == {"memory_mb": 256.0, "gpu": 1.0}
    # alice asks 1.5 of 3 cores: her half of W = 2 (bob, holding no CPU, is not counted)
    assert cpu_commands(d.at(1.0).arrive(act("a0", cpu=1.5, tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("resize", "c2", 0.5), ("start", "a0", 1.5)]


def test_a_heavier_askers_entitlement_is_its_own_weight() -> None:
    # 6 cores, alice weight 2, carol 1 (W = 3): alice is entitled to 4. She holds 2 and asks
    # 1.5 (3.5 of 6 = 0.58 <= 2/3: owed); carol (4, 2 above) gives 1 from c0 and 0.5 from c1
    shares = {"alice": 2.0, "carol": 1.0}
    d = Driver([cpu_node("n", cpu=6)], tenant_shares=shares)
    d.at(0.0).arrive(act("a0", cpu=2, tag="h", tenant="alice", hints=_hint(500.0)),
                     act("c0", cpu=2, tag="l", tenant="carol", hints=_hint(100.0)),
                     act("c1", cpu=2, tag="k", tenant="carol", hints=_hint(90.0)))
    assert d.core.st.nodes["n"].free["cpu"] == 0.0
    assert cpu_commands(d.at(1.0).arrive(act("a1", cpu=1.5, tag="p", tenant="alice"))) == [
        ("resize", "c0", 1.0), ("resize", "c1", 1.5), ("start", "a1", 1.5)]


def test_an_elastic_head_is_not_owed() -> None:
    # alice's elastic test waits for its width (elastic.py): it squeezes nobody
    from core_helpers import elastic

    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    assert cpu_commands(d.at(1.0).arrive(elastic("a0", lo=1, hi=2, tenant="alice"))) == []
    assert d.core.lending is not None and d.core.lending.taken_back == 0


def _gpu_node(cpu: float, gpu: float) -> NodeSpec:
    return NodeSpec("n", Resources(cpu=cpu, memory_mb=8192, gpu=gpu), pool="cpu")


def test_a_head_owed_counts_every_dimension_it_asks_even_a_single_device() -> None:
    # the node's one gpu is free, but alice's head asking it would hold all of it (1 > 1/2):
    # not owed, nothing is squeezed
    d = Driver([_gpu_node(2, 1)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    head = ActionSpec("a0", demand=Resources(cpu=1, memory_mb=256, gpu=1), tag="g", tenant="alice")
    assert cpu_commands(d.at(1.0).arrive(head)) == []


def test_a_dimension_the_asker_holds_none_of_counts_from_zero() -> None:
    # alice holds 1 core of 4; her head asks 1 core and 1 of 2 gpus: cpu 2/4, gpu 1/2, both
    # within her half: owed (gpu counted from 0, not 1)
    d = Driver([_gpu_node(4, 2)], tenant_shares=HALF)
    d.at(0.0).arrive(act("a0", tag="h", tenant="alice", hints=_hint(500.0)),
                     *[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    head = ActionSpec("a1", demand=Resources(cpu=1, memory_mb=256, gpu=1), tag="g", tenant="alice")
    assert cpu_commands(d.at(1.0).arrive(head)) == [("resize", "c0", 0.5), ("resize", "c1", 0.5),
                                              ("start", "a1", 1.0)]


def test_a_dimension_the_asker_holds_and_does_not_ask_counts_as_its_share() -> None:
    # alice holds 1 of 3 gpus (1/3) and no cpu; her head asks 1 core of 4 (1/4): her
    # dominant share is 1/3 <= 1/2: owed
    d = Driver([_gpu_node(4, 3)], tenant_shares=HALF)
    d.at(0.0).arrive(ActionSpec("a0", demand=Resources(memory_mb=256, gpu=1), tag="g", tenant="alice"),
                     *[act(f"c{i}", tag="loop", tenant="carol") for i in range(5)])
    assert d.core.st.tenant_use["alice"] == {"memory_mb": 256.0, "gpu": 1.0}
    assert cpu_commands(d.at(1.0).arrive(act("a1", tag="p", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a1", 1.0)]


def test_an_ended_squeezed_action_is_forgotten() -> None:
    d = Driver([cpu_node("n", cpu=2)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(4)])
    d.at(1.0).arrive(act("a0", tag="p", tenant="alice"))
    lending = d.core.lending
    assert lending is not None and lending.full == {"c0": 1.0, "c1": 1.0}
    assert cpu_commands(d.at(2.0).finish("c0")) == [("resize", "c1", 1.0)]
    assert lending.full == {} and lending.sent == {} and lending.squeezed == {}


@pytest.mark.parametrize("s0_cpu", [0.0, 0.5])
def test_squeezed_actions_on_two_nodes_freed_in_one_event_grow_back_node_by_node(s0_cpu: float) -> None:
    # n0 (2 cores + its session's), n1 and n2 (2 + 1): carol's loops fill them; alice (weight
    # 3) takes back on n0, then n1. At t=7 the three sessions expire in one Tick: n0 gets s0's
    # CPU back (none, or 0.5: its first loop grows by 0.5), n1 gets 1 (both its loops grow
    # back), n2 gets 1 and has nothing squeezed
    from arl_tangram.core import events as ev

    d = Driver([cpu_node("n0", cpu=2 + s0_cpu), cpu_node("n1", cpu=3), cpu_node("n2", cpu=3)],
               tenant_shares={"alice": 3.0, "carol": 1.0})
    d(ev.SessionRequested(0.0, "s0", Resources(cpu=s0_cpu, memory_mb=256), 5.0, node="n0"))
    d(ev.SessionRequested(0.0, "s1", Resources(cpu=1, memory_mb=256), 5.0, node="n1"))
    d(ev.SessionRequested(0.0, "s2", Resources(cpu=1, memory_mb=256), 5.0, node="n2"))
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(6)])
    where = {c.action.id: c.node for c in d.log if isinstance(c, C.StartAction)}
    assert where == {"c0": "n0", "c1": "n0", "c2": "n1", "c3": "n1", "c4": "n2", "c5": "n2"}
    assert cpu_commands(d.at(1.0).arrive(act("a0", tag="loop", tenant="alice"))) == [
        ("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    assert cpu_commands(d.at(1.5).arrive(act("a1", tag="loop", tenant="alice"))) == [
        ("resize", "c2", 0.5), ("resize", "c3", 0.5), ("start", "a1", 1.0)]
    out = d.at(7.0).tick()
    assert {c.session_id for c in out if isinstance(c, C.CloseSession)} == {"s0", "s1", "s2"}
    assert cpu_commands(out) == ([("resize", "c0", 1.0)] if s0_cpu else []) + [
        ("resize", "c2", 1.0), ("resize", "c3", 1.0)]


def test_a_node_without_cpu_is_never_taken_back_on() -> None:
    # g has memory and no CPU: alice's head takes its share back on n, where carol's loops run
    g = NodeSpec("g", Resources(memory_mb=8192, gpu=1), pool="gpu")
    d = Driver([g, cpu_node("n", cpu=2)], tenant_shares=HALF)
    d.at(0.0).arrive(*[act(f"c{i}", tag="loop", tenant="carol") for i in range(3)])
    out = d.at(1.0).arrive(act("a0", tag="loop", tenant="alice"))
    assert cpu_commands(out) == [("resize", "c0", 0.5), ("resize", "c1", 0.5), ("start", "a0", 1.0)]
    assert {c.node for c in out if isinstance(c, (C.StartAction, C.ResizeAction))} == {"n"}
