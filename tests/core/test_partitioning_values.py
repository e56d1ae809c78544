"""core/partitioning.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
pieces of the trajectory slices and task pools (one slice per CPU node by default, CPU-less and
lost nodes out), the slice of each trajectory in turn and the pool of each task (an unknown task
in the largest pool, the larger name on a tie), the nodes a partition tries (best fit on the free
quota, the emptiest first for a whole slice, four at most, the idle pieces when nothing is large
enough), the allotment each start gets (the whole slice up to an elastic action's max, a
fractional piece's quota) and the quotas in use, per partition and node, until each release."""

from __future__ import annotations

from core_helpers import Driver, act, cpu_node, elastic, of

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.records import SessionRecord
from arl_tangram.core.resources import Resources


def _starts(out: list[cmd.Command]) -> list[tuple[str, str, float | None]]:
    return [(c.action.id, c.node, c.allotment.get("cpu")) for c in of(out, cmd.StartAction)]


def _levels(d: Driver, p: str) -> dict[int, list[str]]:
    return {lv: list(b) for lv, b in d.core.partitions.index[p]._buckets.items()}


def _cpu_less(name: str) -> NodeSpec:
    return NodeSpec(name, Resources(memory_mb=4096, gpu=1), pool="gpu")


def test_trajectory_slices_default_to_one_per_cpu_node_and_take_trajectories_in_turn() -> None:
    d = Driver([cpu_node("n0", cpu=3), _cpu_less("g"), cpu_node("n1", cpu=2), cpu_node("n2", cpu=1)],
               policy="trajectory-bound")
    p = d.core.partitions
    assert p.kind == "trajectory" and p.whole_slice is True and p.one_at_a_time is True
    assert p.stale is True and p.pieces == {}
    d.tick()
    assert p.stale is False
    assert p.pieces == {"slot0": [("n0", 2.0)], "slot1": [("n0", 1.0), ("n1", 1.0)],
                        "slot2": [("n1", 1.0), ("n2", 1.0)]}
    assert p.quota == {("slot0", "n0"): 2.0, ("slot1", "n0"): 1.0, ("slot1", "n1"): 1.0,
                       ("slot2", "n1"): 1.0, ("slot2", "n2"): 1.0}
    assert p.by_node == {"n0": ["slot0", "slot1"], "n1": ["slot1", "slot2"], "n2": ["slot2"]}
    assert _levels(d, "slot0") == {8: ["n0"]} and _levels(d, "slot1") == {4: ["n0", "n1"]}
    assert [p.slot_of(t) for t in ("t1", "t2", "t3", "t4", "t2")] == \
        ["slot0", "slot1", "slot2", "slot0", "slot1"]
    assert p.trajectory_slot == {"t1": "slot0", "t2": "slot1", "t3": "slot2", "t4": "slot0"}
    assert p.partition_for(act("x", trajectory="t3")) == "slot2"
    assert p.partition_for(act("t9")) == "slot1"  # no trajectory: its id is its trajectory
    sess = SessionRecord("s", Resources(), 10.0, 0.0, trajectory="t2")
    assert p.session_partition(sess) == "slot1"
    assert p.session_partition(SessionRecord("s", Resources(), 10.0, 0.0, task="a")) is None


def test_slices_are_computed_again_without_a_lost_node_and_keep_what_is_in_use() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2), cpu_node("n2", cpu=2)],
               policy="trajectory-bound")
    p = d.core.partitions
    out = d.arrive(act("a", cpu=0.5, trajectory="t1"))
    assert _starts(out) == [("a", "n0", 0.5)]
    assert p.used == {("slot0", "n0"): 0.5} and _levels(d, "slot0") == {6: ["n0"]}
    d(ev.NodeLost(1.0, "n2"))
    assert p.stale is False  # computed at the end of the event
    assert p.pieces == {"slot0": [("n0", 2.0)], "slot1": [("n1", 2.0)]}
    assert _levels(d, "slot0") == {6: ["n0"]}  # its quota less what a still uses
    assert p.slot_of("t2") == "slot1" and p.slot_of("t3") == "slot0"  # now two slices
    d(ev.NodeAdded(2.0, cpu_node("n3", cpu=4)))
    # 8 cores in three slices of 8/3: n0 [0, 2], n1 [2, 4], n3 [4, 8]
    assert p.pieces == {"slot0": [("n0", 2.0), ("n1", 0.6666666666666665)],
                        "slot1": [("n1", 1.3333333333333335), ("n3", 1.333333333333333)],
                        "slot2": [("n3", 2.666666666666667)]}
    assert d.core.partitions.used == {("slot0", "n0"): 0.5}


def test_compute_marks_every_partition_touched() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="task-isolated", task_shares={"a": 1, "b": 1})
    d.tick()
    st = d.core.st
    st.touched.clear()
    d.core.partitions.compute()
    assert {("part", "task:a"), ("part", "task:b")} <= set(st.touched)


def test_task_pools_follow_the_shares_and_an_unknown_task_goes_to_the_largest() -> None:
    d = Driver([cpu_node("n0", cpu=4), cpu_node("n1", cpu=4)], policy="task-isolated",
               task_shares={"a": 3, "b": 1, "c": 1})
    p = d.core.partitions
    assert p.kind == "task" and p.whole_slice is False and p.one_at_a_time is False
    d.tick()
    assert sorted(p.pieces) == ["task:a", "task:b", "task:c"]
    assert p.pieces["task:a"][0] == ("n0", 4.0)
    assert [p.pool_of(t) for t in ("a", "b", "c", "zzz")] == ["task:a", "task:b", "task:c", "task:a"]
    assert p.partition_for(act("x", task="c")) == "task:c"
    assert p.session_partition(SessionRecord("s", Resources(), 10.0, 0.0, task="b")) == "task:b"
    assert p.session_partition(SessionRecord("s", Resources(), 10.0, 0.0, trajectory="t")) is None
    out = d.arrive(act("x", cpu=1, task="zzz"), act("y", cpu=1, task="b"))
    assert _starts(out) == [("x", "n0", 1.0), ("y", "n1", 1.0)]
    assert p.used == {("task:a", "n0"): 1.0, ("task:b", "n1"): 1.0}
    assert p.running == {"task:a": 1, "task:b": 1}
    assert p.members == {"x": ("task:a", "n0", 1.0), "y": ("task:b", "n1", 1.0)}


def test_an_unknown_task_on_a_tie_goes_to_the_pool_of_the_larger_name() -> None:
    d = Driver([cpu_node("n0", cpu=2)], policy="task-isolated", task_shares={"y": 1, "x": 1, "w": 0.5})
    assert d.core.partitions.pool_of("q") == "task:y"


def test_without_shares_every_task_is_in_one_pool() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=1)], policy="task-isolated")
    p = d.core.partitions
    d.tick()
    assert p.pieces == {"task:*": [("n0", 2.0), ("n1", 1.0)]}
    assert p.pool_of("a") == "task:*" and p.pool_of("") == "task:*"


def test_best_fit_candidates_four_at_most_then_the_idle_pieces_when_none_is_large_enough() -> None:
    d = Driver([cpu_node(f"n{i}", cpu=2) for i in range(6)], policy="task-isolated")
    p = d.core.partitions
    d.tick()
    assert p.piece_candidates("task:*", 1.0, None) == ["n0", "n1", "n2", "n3"]
    assert p.piece_candidates("task:*", 2.0, None) == ["n0", "n1", "n2", "n3"]
    # more than any piece: every idle piece (the largest first)
    assert p.piece_candidates("task:*", 3.0, None) == ["n0", "n1", "n2", "n3", "n4", "n5"]
    assert p.piece_candidates("task:*", 1.0, "n3") == ["n3"]
    assert p.piece_candidates("task:*", 1.0, "zz") == []
    assert p.piece_candidates("task:nope", 1.0, None) == []
    out = d.arrive(act("a", cpu=1.5))
    assert _starts(out) == [("a", "n0", 1.5)]
    assert p.piece_candidates("task:*", 0.5, None) == ["n0", "n1", "n2", "n3"]  # fullest first
    assert p.piece_candidates("task:*", 0.75, None) == ["n1", "n2", "n3", "n4"]
    out = d.arrive(act("b", cpu=0.5))
    assert _starts(out) == [("b", "n0", 0.5)]  # best fit: the piece left with 0.5
    out = d.arrive(act("c", cpu=3))  # larger than a piece: runs on an idle one at its quota
    assert _starts(out) == [("c", "n1", 2.0)]
    assert p.used == {("task:*", "n0"): 2.0, ("task:*", "n1"): 2.0}
    assert p.piece_candidates("task:*", 3.0, None) == ["n2", "n3", "n4", "n5"]
    assert p.piece_candidates("task:*", 2.0, None) == ["n2", "n3", "n4", "n5"]


def test_a_whole_slice_tries_the_emptiest_pieces_first_four_at_most() -> None:
    nodes = [cpu_node("n0", cpu=1), cpu_node("n1", cpu=3), cpu_node("n2", cpu=2),
             cpu_node("n3", cpu=2), cpu_node("n4", cpu=1), cpu_node("n5", cpu=0.5)]
    d = Driver(nodes, policy="trajectory-bound", trajectories=1)
    p = d.core.partitions
    d.tick()
    assert p.pieces == {"slot0": [("n1", 3.0), ("n2", 2.0), ("n3", 2.0), ("n0", 1.0), ("n4", 1.0),
                                  ("n5", 0.5)]}
    assert p.piece_candidates("slot0", 1.0, None) == ["n1", "n2", "n3", "n0"]
    assert p.piece_candidates("slot0", 9.0, None) == ["n1", "n2", "n3", "n0"]
    out = d.arrive(elastic("e", 1, 8, trajectory="t"), act("f", cpu=1, trajectory="u"))
    assert _starts(out) == [("e", "n1", 3.0)]  # the whole piece, one action at a time
    assert p.used == {("slot0", "n1"): 3.0} and p.running == {"slot0": 1}
    assert p.members == {"e": ("slot0", "n1", 3.0)}
    assert p.piece_candidates("slot0", 1.0, None) == ["n2", "n3", "n0", "n4"]
    out = d.finish("e")
    assert _starts(out) == [("f", "n1", 1.0)]  # a rigid action: its demand
    assert p.used == {("slot0", "n1"): 1.0} and p.running == {"slot0": 1}
    assert p.members == {"f": ("slot0", "n1", 1.0)}
    d.finish("f")
    assert p.used == {("slot0", "n1"): 0.0} and p.running == {"slot0": 0} and p.members == {}
    assert _levels(d, "slot0") == {12: ["n1"], 8: ["n2", "n3"], 4: ["n0", "n4"], 2: ["n5"]}


def test_an_elastic_action_gets_its_max_within_a_larger_slice() -> None:
    d = Driver([cpu_node("n0", cpu=8)], policy="trajectory-bound", trajectories=1)
    out = d.arrive(elastic("e", 1, 3, trajectory="t"))
    assert _starts(out) == [("e", "n0", 3.0)]
    assert d.core.partitions.used == {("slot0", "n0"): 3.0}


def test_a_fractional_piece_runs_a_larger_action_at_its_quota() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="trajectory-bound", trajectories=4)
    p = d.core.partitions
    out = d.arrive(act("a", cpu=2, trajectory="t1"), act("b", cpu=0.1, trajectory="t2"))
    assert _starts(out) == [("a", "n0", 0.25), ("b", "n0", 0.1)]
    assert p.used == {("slot0", "n0"): 0.25, ("slot1", "n0"): 0.1}


def test_a_task_pool_runs_several_at_once_and_not_past_its_room() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy="task-isolated",
               task_shares={"a": 1, "b": 1})
    p = d.core.partitions
    out = d.arrive(act("x", cpu=1.5, task="a"), act("y", cpu=0.5, task="a"), act("z", cpu=0.5, task="a"))
    assert _starts(out) == [("x", "n0", 1.5), ("y", "n0", 0.5)]
    assert p.running == {"task:a": 2}
    out = d.finish("y")
    assert _starts(out) == [("z", "n0", 0.5)]
    assert p.release(d.core.actions["x"]) == ("task:a", "n0")
    assert p.used[("task:a", "n0")] == 0.5 and p.running == {"task:a": 1}
    assert _levels(d, "task:a") == {6: ["n0"]}
    assert p.release(d.core.actions["x"]) is None  # released once


def test_a_piece_on_a_node_without_the_memory_is_passed_over() -> None:
    d = Driver([cpu_node("n0", cpu=2, mem=512), cpu_node("n1", cpu=2, mem=8192)], policy="task-isolated")
    out = d.arrive(act("a", cpu=1, mem=1024))
    assert _starts(out) == [("a", "n1", 1.0)]


def test_a_cpu_less_action_runs_in_a_full_piece() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="task-isolated")
    p = d.core.partitions
    out = d.arrive(act("a", cpu=1), act("b", cpu=0, mem=64))
    assert _starts(out) == [("a", "n0", 1.0), ("b", "n0", 0.0)]
    assert p.used == {("task:*", "n0"): 1.0}
    assert p.members["b"] == ("task:*", "n0", 0.0)


def test_one_cpu_node_makes_one_slice_by_default() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="trajectory-bound")
    p = d.core.partitions
    d.tick()
    assert p.pieces == {"slot0": [("n0", 4.0)]}
    assert [p.slot_of(t) for t in ("t1", "t2", "t3")] == ["slot0", "slot0", "slot0"]


def test_a_demand_above_every_piece_but_at_their_level_is_a_best_fit_of_four() -> None:
    d = Driver([cpu_node(f"n{i}", cpu=2) for i in range(6)], policy="task-isolated")
    p = d.core.partitions
    d.tick()
    # 2.1 is at the level of an idle 2-core piece (8 quarters): the index's four, not every idle one
    assert p.piece_candidates("task:*", 2.1, None) == ["n0", "n1", "n2", "n3"]
    assert p.piece_candidates("task:*", 2.25, None) == ["n0", "n1", "n2", "n3", "n4", "n5"]
    d.arrive(act("a", cpu=0.5))  # n0 holds 0.5: not idle
    assert p.piece_candidates("task:*", 3.0, None) == ["n1", "n2", "n3", "n4", "n5"]


def test_no_idle_pieces_are_tried_for_a_demand_the_largest_piece_could_hold() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=1)], policy="task-isolated")
    p = d.core.partitions
    out = d.arrive(act("a", cpu=1.5), act("b", cpu=2))
    assert _starts(out) == [("a", "n0", 1.5)]  # b waits for n0's piece, not n1's idle one
    assert p.piece_candidates("task:*", 2.0, None) == []
    out = d.finish("a")
    assert _starts(out) == [("b", "n0", 2.0)]


def test_the_idle_pieces_tried_are_the_64_largest() -> None:
    d = Driver([cpu_node(f"n{i:02d}", cpu=1) for i in range(66)], policy="task-isolated")
    p = d.core.partitions
    d.tick()
    assert p.piece_candidates("task:*", 2.0, None) == [f"n{i:02d}" for i in range(64)]


def test_a_piece_without_room_for_the_demand_is_passed_over() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2)], policy="task-isolated")
    p = d.core.partitions
    out = d.arrive(act("a", cpu=1.4))
    assert _starts(out) == [("a", "n0", 1.4)]
    # n0's 0.6 left is at 0.7's level (2 quarters): tried first, too small, then n1
    assert p.piece_candidates("task:*", 0.7, None) == ["n0", "n1"]
    out = d.arrive(act("b", cpu=0.7))
    assert _starts(out) == [("b", "n1", 0.7)]
    assert p.used == {("task:*", "n0"): 1.4, ("task:*", "n1"): 0.7}


def test_a_pool_starts_several_actions_of_one_event() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="task-isolated")
    out = d(ev.ActionsArrived(0.0, (act("a", cpu=1), act("b", cpu=1), act("c", cpu=1))))
    assert _starts(out) == [("a", "n0", 1.0), ("b", "n0", 1.0), ("c", "n0", 1.0)]
    assert d.core.partitions.running == {"task:*": 3}


def test_quotas_given_back_leave_exactly_nothing_in_use() -> None:
    d = Driver([cpu_node("n0", cpu=1)], policy="task-isolated")
    p = d.core.partitions
    d.arrive(act("a", cpu=0.1), act("b", cpu=0.2))
    assert p.used == {("task:*", "n0"): 0.1 + 0.2}
    d.finish("a")
    d.finish("b")  # 0.1 + 0.2 - 0.1 - 0.2 is 2.8e-17 in floats: counted as 0
    assert p.used == {("task:*", "n0"): 0.0}
    assert _levels(d, "task:*") == {4: ["n0"]}


def test_an_action_ends_after_its_slice_is_gone() -> None:
    d = Driver([cpu_node("n0", cpu=2), cpu_node("n1", cpu=2), cpu_node("n2", cpu=2)],
               policy="trajectory-bound")
    p = d.core.partitions
    out = d.arrive(act("a", trajectory="t1"), act("b", trajectory="t2"), act("c", trajectory="t3"))
    assert _starts(out) == [("a", "n0", 1.0), ("b", "n1", 1.0), ("c", "n2", 1.0)]
    d(ev.NodeLost(1.0, "n0"))
    assert sorted(p.pieces) == ["slot0", "slot1"]  # slot2 (c's) is gone
    assert p.pieces == {"slot0": [("n1", 2.0)], "slot1": [("n2", 2.0)]}  # b's slice is on n2 now
    d.at(2.0).finish("c")
    assert p.used[("slot2", "n2")] == 0.0 and p.running["slot2"] == 0 and "c" not in p.members
    d.at(2.0).finish("b")
    assert p.used[("slot1", "n1")] == 0.0 and p.running["slot1"] == 0 and "b" not in p.members
    assert _levels(d, "slot1") == {8: ["n2"]}


def _py(aid: str, **kw: object) -> object:
    return act(aid, payload={"language": "python"}, **kw)


def test_a_pool_takes_a_warm_executor_for_a_trajectory_new_on_its_node() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="task-isolated")
    d(ev.WarmPoolReport(0.0, "n0", "python", 3))
    warm = d.core.nodes["n0"].warm
    d.arrive(_py("a", trajectory="t"))
    assert warm["python"] == 2
    d.arrive(_py("b", trajectory="t"))  # its trajectory ran on n0: its executor is warm
    assert warm["python"] == 2
    d.arrive(_py("c", trajectory="u"))
    assert warm["python"] == 1
    assert d.core.partitions.trajectory_node == {"t": "n0", "u": "n0"}


def test_a_slice_takes_no_warm_executor() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="trajectory-bound", trajectories=2)
    d(ev.WarmPoolReport(0.0, "n0", "python", 3))
    d.arrive(_py("a", trajectory="t"), _py("c", trajectory="u"))
    assert d.core.nodes["n0"].warm["python"] == 3
    assert d.core.partitions.trajectory_node == {"t": "n0", "u": "n0"}


def test_a_pool_does_not_use_another_pools_room_on_a_shared_node() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="task-isolated", task_shares={"a": 1, "b": 1})
    p = d.core.partitions
    out = d.arrive(act("x", cpu=1.4, task="a"), act("y", cpu=0.7, task="a"))
    assert _starts(out) == [("x", "n0", 1.4)]  # n0 has 2.6 free, task:a's piece 0.6
    assert p.used == {("task:a", "n0"): 1.4}
    out = d.finish("x")
    assert _starts(out) == [("y", "n0", 0.7)]
