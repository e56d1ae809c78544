"""core/policies.py's values (issue 43 item 2: the survivors of `make mutation` on it): every
policy's switches in `POLICY_TABLE` (module-level data that mutmut does not mutate, pinned here
by hand from the module's docstring), the trajectory an action counts against (its trajectory,
else its session, else its own id), `split_cpu`'s pieces worked out by hand on a line of the
nodes' CPU (cuts inside and at the edge of a node, pieces under a core and of exactly 1e-6, a
partition ending or starting within one core of a node's edge, three partitions over one node,
zero-CPU nodes, zero or a single weight, pieces largest first and then by node name) and
`cpu_nodes` (nodes without CPU, with 0 and with 0.5 cores)."""

from __future__ import annotations

import dataclasses

import pytest

from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.config import POLICIES
from arl_tangram.core.policies import POLICY_TABLE, Policy, cpu_nodes, split_cpu, trajectory_of
from arl_tangram.core.resources import Resources

# ---- the table --------------------------------------------------------------------------------

FIELDS = (
    "name",
    "ordered",
    "elastic",
    "dynamic_models",
    "warm_pools",
    "partitioned",
    "one_at_a_time",
    "whole_slice",
    "resident",
    "fixed",
    "by_use",
)
TABLE = {
    "tangram": ("tangram", True, True, True, True, None, False, False, False, False, True),
    "fifo": ("fifo", False, False, True, True, None, False, False, False, False, True),
    "task-isolated": (
        "task-isolated",
        False,
        False,
        False,
        False,
        "task",
        False,
        False,
        True,
        False,
        False,
    ),
    "trajectory-bound": (
        "trajectory-bound",
        False,
        False,
        False,
        False,
        "trajectory",
        True,
        True,
        True,
        False,
        False,
    ),
    "static-pool": (
        "static-pool",
        False,
        False,
        False,
        False,
        None,
        False,
        False,
        True,
        True,
        False,
    ),
}


def test_the_policy_table_by_hand() -> None:
    assert tuple(f.name for f in dataclasses.fields(Policy)) == FIELDS
    assert list(POLICY_TABLE) == [
        "tangram",
        "fifo",
        "task-isolated",
        "trajectory-bound",
        "static-pool",
    ]
    assert set(POLICY_TABLE) == set(POLICIES)
    for name, want in TABLE.items():
        assert dataclasses.astuple(POLICY_TABLE[name]) == want, name
        assert type(POLICY_TABLE[name]) is Policy


def test_a_policy_is_frozen_and_slotted() -> None:
    p = POLICY_TABLE["tangram"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.elastic = False  # type: ignore[misc]
    assert not hasattr(p, "__dict__")


# ---- trajectory_of ---------------------------------------------------------------------------


def test_an_actions_trajectory_then_session_then_id() -> None:
    assert trajectory_of(ActionSpec("a1", trajectory="t", session="s")) == "t"
    assert trajectory_of(ActionSpec("a1", trajectory="t")) == "t"
    assert trajectory_of(ActionSpec("a1", session="s")) == "s"
    assert trajectory_of(ActionSpec("a1")) == "a1"


# ---- split_cpu --------------------------------------------------------------------------------


def test_a_cut_inside_a_node_and_one_at_its_edge() -> None:
    # the line: a = [0, 4), b = [4, 6); x = [0, 2), y = [2, 6)
    got = split_cpu([("a", 4.0), ("b", 2.0)], {"x": 1.0, "y": 2.0})
    assert got == {"x": [("a", 2.0)], "y": [("a", 2.0), ("b", 2.0)]}
    # x = [0, 4) ends where b begins: b is all y's
    got = split_cpu([("a", 4.0), ("b", 2.0)], {"x": 2.0, "y": 1.0})
    assert got == {"x": [("a", 4.0)], "y": [("b", 2.0)]}


def test_pieces_largest_first_then_by_node_name() -> None:
    # x = [0, 3), y = [3, 6): y has 1 core of a and 2 of b
    got = split_cpu([("a", 4.0), ("b", 2.0)], {"x": 1.0, "y": 1.0})
    assert got == {"x": [("a", 3.0)], "y": [("b", 2.0), ("a", 1.0)]}
    # equal pieces: by name, not by the nodes' order
    assert split_cpu([("b", 2.0), ("a", 2.0)], {"x": 1.0}) == {"x": [("a", 2.0), ("b", 2.0)]}


def test_a_partition_within_one_core_of_a_nodes_edge() -> None:
    # x ends half a core after the node's start; y starts half a core before its end
    assert split_cpu([("a", 4.0)], {"x": 1.0, "y": 7.0}) == {"x": [("a", 0.5)], "y": [("a", 3.5)]}
    assert split_cpu([("a", 4.0)], {"x": 7.0, "y": 1.0}) == {"x": [("a", 3.5)], "y": [("a", 0.5)]}


def test_three_partitions_over_the_nodes() -> None:
    # x = [0, 1), y = [1, 2), z = [2, 4); a = [0, 3), b = [3, 4)
    got = split_cpu([("a", 3.0), ("b", 1.0)], {"x": 1.0, "y": 1.0, "z": 2.0})
    assert got == {"x": [("a", 1.0)], "y": [("a", 1.0)], "z": [("a", 1.0), ("b", 1.0)]}
    # x and y both end before b: z alone on b
    got = split_cpu([("a", 2.0), ("b", 2.0)], {"x": 1.0, "y": 1.0, "z": 2.0})
    assert got == {"x": [("a", 1.0)], "y": [("a", 1.0)], "z": [("b", 2.0)]}


def test_one_core_and_a_single_weight() -> None:
    assert split_cpu([("a", 1.0)], {"x": 1.0, "y": 1.0}) == {"x": [("a", 0.5)], "y": [("a", 0.5)]}
    assert split_cpu([("a", 3.0), ("b", 1.0)], {"x": 1.0}) == {"x": [("a", 3.0), ("b", 1.0)]}
    assert split_cpu([("a", 3.0)], {"x": 0.5}) == {"x": [("a", 3.0)]}


def test_a_piece_of_exactly_1e_6_is_dropped() -> None:
    assert split_cpu([("a", 1e-6)], {"x": 1.0}) == {"x": []}
    assert split_cpu([("a", 2e-6)], {"x": 1.0}) == {"x": [("a", 2e-6)]}


def test_zero_cpu_and_zero_weights_give_empty_partitions() -> None:
    assert split_cpu([("a", 4.0)], {"x": 0.0}) == {"x": []}
    assert split_cpu([("a", 4.0)], {"x": 0.0, "y": 0.0}) == {"x": [], "y": []}
    assert split_cpu([], {"x": 1.0}) == {"x": []}
    assert split_cpu([("a", 0.0)], {"x": 1.0}) == {"x": []}
    assert split_cpu([("a", 4.0)], {}) == {}


def test_a_zero_cpu_node_after_the_last_partition() -> None:
    assert split_cpu([("a", 2.0), ("z", 0.0)], {"x": 1.0}) == {"x": [("a", 2.0)]}
    assert split_cpu([("a", 2.0), ("z", 0.0)], {"x": 1.0, "y": 1.0}) == {
        "x": [("a", 1.0)],
        "y": [("a", 1.0)],
    }


# ---- cpu_nodes --------------------------------------------------------------------------------


def test_cpu_nodes_lists_the_nodes_with_cpu_in_order() -> None:
    nodes = [
        ("g", {"gpu": 1.0}),
        ("b", {"cpu": 2.0}),
        ("z", {"cpu": 0.0}),
        ("h", {"cpu": 0.5}),
        ("a", Resources(cpu=1, memory_mb=5)),
        ("m", Resources(memory_mb=5)),
    ]
    assert cpu_nodes(nodes) == [("b", 2.0), ("h", 0.5), ("a", 1.0)]
    assert cpu_nodes([]) == []
