"""`core.placement.Placer`'s contract where no other test looks (issue 27, mutation testing of
core/placement.py):

- an aged shared-pool action that cannot start holds, for itself alone, a node whose capacity
  fits it (not merely the one with the most free CPU), and the hold ends with it;
- an action that exactly fills a node's free capacity starts there;
- a StartAction says whether a warm executor is there: one is taken from the node's pool for
  the action's key only, and only while the pool has one (resident stacks: always, outside
  sessions); a node whose pool ran dry is no longer listed warm;
- a start carries the cause of the event that led to it;
- with more warm nodes than `WARM_SCAN`, all full, a two-dimension demand takes the best fit of
  the index, a GPU demand a warm node of the index;
- the bookkeeping of elastic actions started on a node stays right after many have ended there.
"""

from __future__ import annotations

import pytest
from core_helpers import Driver, act, cpu_node, elastic, starts

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status, WorkHints
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.placement import WARM_SCAN
from arl_tangram.core.records import ActionRecord
from arl_tangram.core.resources import Resources


def _small(aid: str) -> ActionSpec:
    return act(aid, cpu=1, mem=256, hints=WorkHints(expected_s=1000))


def _held_scene() -> tuple[Driver, list[str]]:
    """n0 (2 cores, 512 MB) runs two small actions, n1 (2 cores, 256 MB: it can never hold
    `big`) one, with a core free but no memory. `big` (2 cores, 512 MB) queued at t=1; one of
    n0's actions ends at t=5 (a core free there, not enough for `big`). Returns the driver and
    the action left on n0."""
    d = Driver([NodeSpec("n0", Resources(cpu=2, memory_mb=512), pool="cpu"),
                NodeSpec("n1", Resources(cpu=2, memory_mb=256), pool="cpu")],
               policy="tangram", aging_s=10.0, aging_min_s=10.0)
    out = d.arrive(_small("x0"), _small("x1"), _small("x2"))
    on_n0 = sorted(a for a, s in starts(out).items() if s.node == "n0")
    assert len(on_n0) == 2 and len(starts(out)) == 3
    d.at(1).arrive(act("big", cpu=2, mem=512, hints=WorkHints(expected_s=1)))
    d.at(5).finish(on_n0[0])
    assert d.status("big") is Status.QUEUED
    return d, on_n0[1:]


def test_an_aged_blocked_action_holds_a_node_that_can_hold_it() -> None:
    """At t=12 `big` has aged; `s1` arrives and would fit n0's free core, but the pass that
    finds `big` blocked holds n0 for it first."""
    d, left = _held_scene()
    out = d.at(12).arrive(act("s1", cpu=1, mem=256, hints=WorkHints(expected_s=1)))
    assert not starts(out) and d.status("s1") is Status.QUEUED
    out = d.at(13).finish(left[0])
    assert starts(out)["big"].node == "n0" and d.status("s1") is Status.QUEUED


def test_the_hold_ends_when_the_aged_action_is_cancelled() -> None:
    d, _left = _held_scene()
    d.at(12).arrive(act("s1", cpu=1, mem=256, hints=WorkHints(expected_s=1)))
    assert d.status("s1") is Status.QUEUED
    out = d.at(14)(ev.CancelRequested(14.0, "big"))
    assert starts(out)["s1"].node == "n0"  # at once, not at the next event


def test_an_aged_action_of_a_session_without_a_node_holds_nothing() -> None:
    """A session waiting for room (no node yet) whose action has aged: nothing is held for it,
    and both start once room frees."""
    d = Driver([cpu_node("n0", cpu=1, mem=256)], policy="tangram", aging_s=10.0, aging_min_s=10.0)
    d.arrive(_small("x"))
    d(ev.SessionRequested(0.0, "s", demand=Resources(memory_mb=256)))
    d.at(1).arrive(act("a", cpu=1, mem=0, session="s", hints=WorkHints(expected_s=1)))
    assert d.status("a") is Status.QUEUED
    d.at(12).tick()  # aged, still blocked
    assert not d.core.st.reserved
    out = d.at(13).finish("x")
    assert d.status("a") in (Status.STARTING, Status.RUNNING) or "a" in starts(out)


def test_an_exact_fit_starts() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=512)], policy="tangram")
    d.arrive(_small("x0"), _small("x1"), _small("y"))
    assert d.status("y") is Status.QUEUED
    out = d.at(1).finish("x0")  # 1 core and 256 MB free: y fills them exactly
    assert starts(out)["y"].node == "n0"


# ---- warm executors ---------------------------------------------------------------------------
def _wkey(spec: ActionSpec) -> str:
    return ActionRecord(spec, 0.0, 0).wkey


def test_no_warm_executor_means_a_cold_start() -> None:
    d = Driver([cpu_node("n0")], policy="tangram")
    assert starts(d.arrive(_small("a")))["a"].warm is False


@pytest.mark.parametrize("policy", ["static-pool", "trajectory-bound"])
def test_resident_stacks_start_warm_outside_sessions(policy: str) -> None:
    d = Driver([cpu_node("n0")], policy=policy)
    st = d.core.st
    out = d.arrive(_small("a"))
    assert starts(out)["a"].warm is st.resident


def test_warm_executors_are_taken_from_the_actions_key_while_there_are_some() -> None:
    d = Driver([cpu_node("n0", cpu=8, mem=8192)], policy="tangram")
    placer, n0 = d.core.placer, d.core.st.nodes["n0"]
    key = _wkey(_small("a0"))
    placer.set_warm(n0, "some-other-key", 3)
    out = d.arrive(_small("a0"))  # the node is warm, but for another key
    assert starts(out)["a0"].warm is False
    placer.set_warm(n0, key, 2)
    flags = [starts(d.arrive(_small(f"a{i}")))[f"a{i}"].warm for i in (1, 2, 3)]
    assert flags == [True, True, False]
    assert n0.warm.get(key) == 0 and "n0" not in placer.warm_nodes.get(key, {})
    assert "n0" in placer.warm_nodes["some-other-key"]


def test_a_start_carries_its_cause() -> None:
    d = Driver([cpu_node("n0", cpu=1, mem=256)], policy="tangram")
    out = d.arrive(_small("a"), _small("b"))
    assert starts(out)["a"].cause == "ActionArrived:a"
    assert "t=0 QUEUED->STARTING (cause ActionArrived:a)" in d.core.story("a")
    out = d.at(5).finish("a")
    assert starts(out)["b"].cause == "ActionFinished:a"
    assert "t=5 QUEUED->STARTING (cause ActionFinished:a)" in d.core.story("b")


# ---- more warm nodes than one scan looks at ------------------------------------------------------
def _many_warm(gpu: bool) -> tuple[Core, ActionRecord]:
    """WARM_SCAN + 6 warm nodes, the first WARM_SCAN full; one cold node left exactly the
    action's demand free (the best fit); the action's warm key is theirs."""
    dims = {"cpu": 8.0, "memory_mb": 8192.0, **({"gpu": 2.0} if gpu else {})}
    names = [f"w{i:03d}" for i in range(WARM_SCAN + 6)] + ["cold"]
    core = Core(ClusterSpec(tuple(NodeSpec(n, Resources(dims)) for n in names)),
                CoreConfig(policy="tangram"))
    spec = ActionSpec("a", demand=Resources({"cpu": 1.0, "memory_mb": 1024.0,
                                             **({"gpu": 1.0} if gpu else {})}), tag="python")
    rec = ActionRecord(spec, 0.0, 1)
    for name in names:
        node = core.st.nodes[name]
        if name == "cold":
            node.take({k: v - spec.demand.get(k) for k, v in dims.items()})
        elif int(name[1:]) < WARM_SCAN:
            node.take(dict(dims))
        if name != "cold":
            core.placer.set_warm(node, rec.wkey, 1)
        core.st.index.update(name, node.free)
    return core, rec


def test_past_the_warm_scan_a_cpu_demand_takes_the_best_fit() -> None:
    core, rec = _many_warm(gpu=False)
    got = core.placer.find_node(rec)
    assert got is not None and got.name == "cold"


def test_past_the_warm_scan_a_gpu_demand_still_prefers_a_warm_node() -> None:
    core, rec = _many_warm(gpu=True)
    got = core.placer.find_node(rec)
    assert got is not None and got.name.startswith("w") and int(got.name[1:]) >= WARM_SCAN


# ---- elastic bookkeeping --------------------------------------------------------------------------
def test_many_elastic_actions_ended_on_a_node_leave_its_running_ones_tracked() -> None:
    """A long elastic action runs while 40 short ones start and end beside it, one at a time:
    what the core tracks of the node's elastic actions (checked by `validate` after each event)
    stays right as the ended ones are dropped."""
    d = Driver([cpu_node("n0", cpu=3, mem=8192)], policy="tangram")
    out = d.arrive(elastic("long", lo=1, hi=2, hints=WorkHints(expected_s=10_000)))
    assert "long" in starts(out)
    t = 0.0
    for i in range(40):
        t += 1.0
        out = d.at(t).arrive(elastic(f"s{i}", lo=1, hi=4, hints=WorkHints(expected_s=0.5)))
        assert f"s{i}" in starts(out)
        t += 0.5
        d.at(t).finish(f"s{i}")
    assert d.status("long") in (Status.STARTING, Status.RUNNING)
    assert list(d.core.st.nodes["n0"].elastic) == ["long"]


def test_a_full_node_working_through_elastic_actions_keeps_its_growable_ones_tracked() -> None:
    """A backlog of 60 elastic actions on one 2-core node, always full: each finish starts the
    next, so expansion never walks the node's growable actions, and the ended ones pile up there
    until they are dropped; `validate` (after each event) checks every running one below its
    maximum is still tracked."""
    d = Driver([cpu_node("n0", cpu=2, mem=8192)], policy="tangram")
    out = d.arrive(*(elastic(f"e{i}", lo=1, hi=4, hints=WorkHints(expected_s=5)) for i in range(60)))
    running = set(starts(out))
    t = 0.0
    done = 0
    while running:
        t += 1.0
        aid = min(running)
        out = d.at(t).finish(aid)
        done += 1
        running = {a for a in running | set(starts(out))
                   if d.status(a) in (Status.STARTING, Status.RUNNING)}
    assert done == 60
