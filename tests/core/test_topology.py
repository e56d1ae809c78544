"""Topology-aware device choice: one NVLink domain, best fit, reasons for the impossible."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.core.cluster import ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.core.topology import can_ever_place, choose_devices, place_on_nodes

DOMAINS = [[0, 1], [2, 3]]


def _domain_of(dev: int, domains=DOMAINS) -> int:
    return next(i for i, d in enumerate(domains) if dev in d)


def test_two_device_instance_never_split_across_domains() -> None:
    # Exhaustive over every free set of a 4-device, 2x2 node.
    for r in range(5):
        for free in itertools.combinations(range(4), r):
            got = choose_devices(free, DOMAINS, 2)
            possible = any(set(d) <= set(free) for d in DOMAINS)
            if not possible:
                assert got is None, (free, got)
                continue
            assert got is not None and len(set(got)) == 2
            assert set(got) <= set(free)
            assert len({_domain_of(d) for d in got}) == 1, (free, got)


def test_one_free_per_domain_is_not_enough_for_two() -> None:
    assert choose_devices([1, 2], DOMAINS, 2) is None
    assert choose_devices([1, 2], DOMAINS, 1) in ((1,), (2,))


def test_best_fit_prefers_fuller_domain() -> None:
    # domain A has 4 free, domain B has 2 free: a 2-device instance goes to B.
    domains = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert choose_devices([0, 1, 2, 3, 6, 7], domains, 2) == (6, 7)
    # a 1-device instance goes to the domain with a single free device
    assert choose_devices([0, 1, 2, 5], domains, 1) == (5,)


def test_memory_filter_and_order() -> None:
    mem = {0: 100.0, 1: 500.0, 2: 300.0, 3: 50.0}
    assert choose_devices(range(4), [[0, 1, 2, 3]], 2, memory_free=mem, memory_needed=200) == (1, 2)
    assert choose_devices(range(4), [[0, 1, 2, 3]], 3, memory_free=mem, memory_needed=200) is None
    # least free memory that suffices first
    assert choose_devices(range(4), [[0, 1, 2, 3]], 1, memory_free=mem, memory_needed=90) == (0,)


def test_unlisted_devices_are_singletons_and_empty_domains_mean_one() -> None:
    assert choose_devices([0, 4], [[0, 1]], 2) is None
    assert choose_devices([0, 4], [], 2) == (0, 4)
    assert choose_devices([], [], 1) is None
    with pytest.raises(ValueError, match="count"):
        choose_devices([0], [], 0)


def _node(gpus: int, mem_per: float, domains=()) -> NodeSpec:
    cap = Resources(gpu=gpus, gpu_memory_mb=gpus * mem_per, cpu=8)
    return NodeSpec("n0", cap, "gpu", tuple(tuple(d) for d in domains))


def test_can_ever_place_reasons() -> None:
    node = _node(4, 1000, DOMAINS)
    assert can_ever_place(node, ModelSpec("m", devices=2, memory_mb=800)) is None
    why = can_ever_place(node, ModelSpec("big", devices=4, memory_mb=10))
    assert why is not None and "NVLink domain" in why and "big" in why
    why = can_ever_place(node, ModelSpec("fat", devices=1, memory_mb=5000))
    assert why is not None and "5000" in why
    why = can_ever_place(node, ModelSpec("wide", devices=8, memory_mb=10))
    assert why is not None and "only 4" in why
    cpu = NodeSpec("c0", Resources(cpu=8))
    assert "no GPU" in (can_ever_place(cpu, ModelSpec("m")) or "")
    assert place_on_nodes([cpu, node], ModelSpec("m", devices=2, memory_mb=10)) is None
    why = place_on_nodes([cpu, node], ModelSpec("fat", memory_mb=1e6))
    assert why is not None and "c0" in why and "n0" in why


@st.composite
def _topologies(draw: st.DrawFn) -> tuple[list[list[int]], set[int], dict[int, float], int, float]:
    n = draw(st.integers(1, 10))
    devs = draw(st.permutations(list(range(n))))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=3)))
    domains = [list(devs[a:b]) for a, b in zip([0, *cuts], [*cuts, n], strict=True) if devs[a:b]]
    free = draw(st.sets(st.integers(0, n - 1)))
    mem = {d: draw(st.sampled_from([0.0, 100.0, 500.0, 1000.0])) for d in range(n)}
    return domains, free, mem, draw(st.integers(1, 4)), draw(st.sampled_from([0.0, 200.0, 800.0]))


@settings(max_examples=300, deadline=None)
@given(_topologies())
def test_choose_devices_properties(topo) -> None:
    domains, free, mem, count, need = topo
    got = choose_devices(free, domains, count, memory_free=mem, memory_needed=need)
    usable = [[d for d in dom if d in free and mem[d] >= need] for dom in domains]
    if got is None:
        assert all(len(u) < count for u in usable)
        return
    assert len(got) == count == len(set(got)) and list(got) == sorted(got)
    assert set(got) <= free and all(mem[d] >= need for d in got)
    homes = [i for i, dom in enumerate(domains) if set(got) <= set(dom)]
    assert len(homes) == 1  # inside exactly one domain
    fitting = [len(u) for u in usable if len(u) >= count]
    assert len(usable[homes[0]]) == min(fitting)  # best fit
