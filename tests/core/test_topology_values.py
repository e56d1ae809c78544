"""core/topology.py's values (issue 43 item 2: the survivors of `make mutation` on it): the
domains restricted to the free devices (unlisted free devices as singletons, no topology as one
domain, no free device as none), `choose_devices`' exact answers (count 1 allowed, a domain with
exactly `count` usable devices taken, a too-small domain skipped for a later one, ties of best
fit to the domain listed first, the least free memory that suffices first, a device missing from
`memory_free` as 0 MB, memory within 1e-9 of the need and exactly 1e-9 short, the default need
0 MB), `can_ever_place`'s reasons word for word at each boundary (one GPU, devices = GPUs =
largest domain, memory = per device, memory of 0 and of 0.5 MB, a node declaring 0 or 1 MB of
GPU memory) and `place_on_nodes`' joined reasons."""

from __future__ import annotations

import pytest

from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.core.topology import (
    _effective_domains,
    can_ever_place,
    choose_devices,
    place_on_nodes,
)


def _node(name: str, gpus: int, gpu_memory_mb: float, domains=()) -> NodeSpec:
    cap = Resources(cpu=8, gpu=gpus, gpu_memory_mb=gpu_memory_mb)
    return NodeSpec(name, cap, "gpu", tuple(tuple(d) for d in domains))


# ---- the domains ----------------------------------------------------------------------------


def test_domains_restricted_to_the_free_devices_and_unlisted_ones_alone() -> None:
    got = _effective_domains({0, 1, 2, 5, 7}, [[1, 0, 1], [3, 2], [4]])
    assert got == [(0, 1), (2,), (), (5,), (7,)]


def test_no_topology_is_one_domain_and_no_free_device_none() -> None:
    assert _effective_domains({3, 0, 2}, []) == [(0, 2, 3)]
    assert _effective_domains(set(), []) == []
    assert _effective_domains(set(), [[0, 1]]) == [()]


# ---- choose_devices -------------------------------------------------------------------------


def test_count_below_one_is_refused_and_one_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"^count must be >= 1, got 0$"):
        choose_devices([0], [], 0)
    assert choose_devices([0], [], 1) == (0,)
    assert choose_devices([4, 1], [], 1) == (1,)


def test_a_domain_with_exactly_count_usable_devices_is_taken() -> None:
    assert choose_devices([2, 3], [[0, 1], [2, 3]], 2) == (2, 3)
    assert choose_devices([0, 1, 2], [[0, 1, 2]], 3) == (0, 1, 2)


def test_a_domain_too_small_is_skipped_for_a_later_one() -> None:
    # the first domain has one free device: the search goes on to the second
    assert choose_devices([0, 2, 3], [[0, 1], [2, 3]], 2) == (2, 3)
    assert choose_devices([0, 4, 5, 6], [[0, 1], [2, 3], [4, 5, 6]], 3) == (4, 5, 6)


def test_a_tie_of_best_fit_goes_to_the_domain_listed_first() -> None:
    assert choose_devices([0, 1, 2, 3], [[2, 3], [0, 1]], 2) == (2, 3)
    assert choose_devices([0, 1, 2, 3], [[0, 1], [2, 3]], 1) == (0,)
    # the smaller of two fitting domains, wherever it is listed
    assert choose_devices([0, 1, 2, 3, 4], [[0, 1, 2], [3, 4]], 2) == (3, 4)


def test_least_free_memory_that_suffices_first() -> None:
    mem = {0: 900.0, 1: 300.0, 2: 500.0, 3: 100.0}
    assert choose_devices(range(4), [], 1, memory_free=mem, memory_needed=200) == (1,)
    assert choose_devices(range(4), [], 2, memory_free=mem, memory_needed=200) == (1, 2)
    assert choose_devices(range(4), [], 3, memory_free=mem, memory_needed=200) == (0, 1, 2)
    # equal memory: lowest index first
    same = {0: 5.0, 1: 5.0, 2: 5.0}
    assert choose_devices([2, 1, 0], [], 2, memory_free=same, memory_needed=5.0) == (0, 1)
    # without memory figures every free device is usable, lowest indices first
    assert choose_devices([3, 0, 2], [], 2) == (0, 2)


def test_a_device_missing_from_memory_free_has_zero_memory() -> None:
    # unusable for any need above 1e-9, and for 0.5 MB
    assert choose_devices([2], [], 1, memory_free={}, memory_needed=0.5) is None
    assert choose_devices([0, 2], [], 1, memory_free={0: 0.5}, memory_needed=0.5) == (0,)
    # usable for a need of 0, and then sorted as 0 MB: before one with 0.5 MB
    assert choose_devices([0, 1, 2], [], 1, memory_free={0: 0.5, 1: 50.0}) == (2,)
    assert choose_devices([0, 1, 2], [], 2, memory_free={0: 0.5, 1: 50.0}) == (0, 2)


def test_the_default_need_is_zero_mb() -> None:
    assert choose_devices([0], [], 1, memory_free={0: 0.5}) == (0,)
    assert choose_devices([0], [], 1, memory_free={0: 0.0}) == (0,)


def test_memory_within_1e_9_of_the_need_suffices() -> None:
    assert choose_devices([0], [], 1, memory_free={0: 100.0}, memory_needed=100.0) == (0,)
    assert choose_devices([0], [], 1, memory_free={0: 100.0 - 5e-10}, memory_needed=100.0) == (0,)
    # exactly 1e-9 short (the same float on both sides) still suffices
    assert choose_devices([0], [], 1, memory_free={0: 100.0}, memory_needed=100.0 + 1e-9) == (0,)
    assert choose_devices([0], [], 1, memory_free={0: 0.0}, memory_needed=1e-9) == (0,)
    assert choose_devices([0], [], 1, memory_free={0: 100.0}, memory_needed=100.0 + 1e-6) is None


# ---- can_ever_place, place_on_nodes ---------------------------------------------------------


def test_one_gpu_is_enough_for_a_one_device_model() -> None:
    assert can_ever_place(_node("g1", 1, 1000), ModelSpec("m", memory_mb=1000)) is None


def test_devices_equal_to_the_gpus_and_the_largest_domain_fit() -> None:
    node = _node("g4", 4, 4000, [[0, 1], [2, 3]])
    assert can_ever_place(node, ModelSpec("m", devices=2, memory_mb=10)) is None
    whole = _node("w4", 4, 4000)
    assert can_ever_place(whole, ModelSpec("m", devices=4, memory_mb=10)) is None


def test_the_reasons_word_for_word() -> None:
    cpu = NodeSpec("c0", Resources(cpu=8))
    assert can_ever_place(cpu, ModelSpec("m", devices=2)) == (
        "node c0 has no GPU devices; model m needs 2"
    )
    node = _node("g4", 4, 4000, [[0, 1], [2, 3]])
    assert can_ever_place(node, ModelSpec("wide", devices=5)) == (
        "model wide needs 5 devices per instance; node g4 has only 4"
    )
    assert can_ever_place(node, ModelSpec("big", devices=3)) == (
        "model big needs 3 devices inside one NVLink domain; the largest domain of node g4 has 2"
    )
    assert can_ever_place(node, ModelSpec("fat", memory_mb=1000.5)) == (
        "model fat needs 1000.5 MB per device; node g4 has 1000 MB per device"
    )


def test_model_memory_of_zero_needs_no_declared_gpu_memory() -> None:
    bare = _node("b1", 1, 0)
    assert can_ever_place(bare, ModelSpec("m", memory_mb=0)) is None
    assert can_ever_place(bare, ModelSpec("m", memory_mb=0.5)) == (
        "node b1 declares no gpu_memory_mb; model m needs 0.5 MB per device"
    )


def test_a_node_with_one_mb_of_gpu_memory_declares_some() -> None:
    tiny = _node("t1", 1, 1)
    assert can_ever_place(tiny, ModelSpec("m", memory_mb=1)) is None
    assert can_ever_place(tiny, ModelSpec("m", memory_mb=2)) == (
        "model m needs 2 MB per device; node t1 has 1 MB per device"
    )


def test_model_memory_equal_to_a_device_or_1e_9_above_fits() -> None:
    node = _node("g2", 2, 200)
    assert can_ever_place(node, ModelSpec("m", memory_mb=100.0)) is None
    assert can_ever_place(node, ModelSpec("m", memory_mb=100.0 + 1e-9)) is None
    assert can_ever_place(node, ModelSpec("m", memory_mb=100.0 + 1e-6)) is not None


def test_place_on_nodes_joins_every_reason_or_says_there_are_none() -> None:
    cpu = NodeSpec("c0", Resources(cpu=8))
    small = _node("g1", 1, 100)
    assert place_on_nodes([cpu, small], ModelSpec("m", memory_mb=200)) == (
        "node c0 has no GPU devices; model m needs 1; "
        "model m needs 200 MB per device; node g1 has 100 MB per device"
    )
    assert place_on_nodes([cpu, small], ModelSpec("m", memory_mb=100)) is None
    assert place_on_nodes([small, cpu], ModelSpec("m", memory_mb=100)) is None
    assert place_on_nodes([], ModelSpec("m")) == "model m: no nodes to place it on"
