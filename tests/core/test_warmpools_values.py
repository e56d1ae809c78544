"""core/warmpools.py's values (issue 43 item 2: the survivors of `make mutation` on it): the warm
targets sent, node by node and in order -- the per-node cap (eight per core, at least 16), the
operator's named keys at the first event, a burst and the rates at Ticks (smoothing, the decaying
peaks, the cold-start window), and the targets resent only where they change."""

from __future__ import annotations

import pytest
from core_helpers import Driver, cpu_node

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import Resources


def _py(aid: str) -> ActionSpec:
    return ActionSpec(aid, demand=Resources(cpu=0.01, memory_mb=1), payload={"language": "python"})


def _sent(out: list[cmd.Command], key: str = "python") -> list[tuple[str, int]]:
    return [(c.node, c.size) for c in out if isinstance(c, cmd.ResizeWarmPool) and c.key == key]


def _last(d: Driver, key: str = "python") -> dict[str, int]:
    return dict(_sent(d.log, key))


def test_the_cap_per_node_is_eight_per_core_at_least_sixteen_and_cpu_less_nodes_get_none() -> None:
    gpu = NodeSpec("g", Resources(memory_mb=8192, gpu=1), pool="gpu")
    nodes = [cpu_node("n1", cpu=1), cpu_node("n2", cpu=2), cpu_node("n2b", cpu=2.125),
             cpu_node("n3", cpu=2.5), cpu_node("n4", cpu=3), gpu]
    d = Driver(nodes, policy="tangram", sandbox_cold_s=1.0)
    d.at(0.0).tick()
    d.at(0.0)(ev.ActionsArrived(0.0, tuple(_py(f"a{i}") for i in range(100))))
    assert _last(d) == {"n1": 16, "n2": 16, "n2b": 17, "n3": 20, "n4": 24}


def _boot(**cfg: object) -> Driver:
    return Driver([cpu_node("n0"), cpu_node("n1")], policy="tangram", sandbox_cold_s=1.0, **cfg)


@pytest.mark.parametrize(("cfg", "k", "j"), [
    ({"warm_boot": {"k": 5}, "min_warm_per_node": 1}, [("n0", 3), ("n1", 2)], [("n0", 1), ("n1", 1)]),
    ({"warm_boot": {"k": 1}, "min_warm_per_node": 0}, [("n0", 1)], []),
    ({"min_warm_per_node": 1}, [("n0", 1), ("n1", 1)], [("n0", 1), ("n1", 1)]),
])
def test_named_keys_get_their_pools_at_the_first_event_and_keep_them_when_idle(
        cfg: dict, k: list[tuple[str, int]], j: list[tuple[str, int]]) -> None:
    # k: its warm_boot count over the cluster (or min_warm_per_node per node); j (named, no
    # boot count): min_warm_per_node per node. Idle Ticks later change nothing.
    d = _boot(warm_keys=("k", "j"), **cfg)
    out = d.at(0.0).tick()
    assert (_sent(out, "k"), _sent(out, "j")) == (k, j)
    assert [c for c in d.at(1.0).tick() if isinstance(c, cmd.ResizeWarmPool)] == []
    assert [c for c in d.at(700.0).tick() if isinstance(c, cmd.ResizeWarmPool)] == []
    # the named keys' rates are kept beside those of keys that arrive
    d.at(701.0).arrive(_py("a0"))
    d.at(702.0).tick()
    assert set(d.core.warm.rates) == {"k", "j", "python"}


def test_a_policy_without_warm_pools_sends_none_for_named_keys() -> None:
    d = Driver([cpu_node("n0")], policy="static-pool", warm_keys=("k",), warm_boot={"k": 3})
    assert _sent(d.at(0.0).tick(), "k") == []


def test_targets_follow_a_burst_at_once_and_decay_at_ticks() -> None:
    # one node, no floor; cold 0.5 s, rates over 10 s, peaks over 100 s
    d = Driver([cpu_node("n0", cpu=64)], policy="tangram", sandbox_cold_s=0.5, rate_window_s=10.0,
               peak_memory_s=100.0, min_warm_per_node=0, max_warm_per_node=1000)
    d.at(0.0).tick()
    got = []
    for i, t in enumerate((1.0, 1.0, 1.25, 1.5)):  # (1.0 and 1.5: one cold time apart exactly)
        got.append(_sent(d.at(t).arrive(_py(f"a{i}"))))
    # the first: the burst of 1 in 0.5 s (2/s: 2 x 0.5 x 2 = 2), then its rate 0.1/s (1);
    # three in 0.5 s (6/s: 6), then four: the two at 1.0 are still within 0.5 s of 1.5 (8)
    assert got == [[("n0", 2), ("n0", 1)], [("n0", 4)], [("n0", 6)], [("n0", 8)]]
    ticks = {}
    for t in (2.0, 2.0, 5.0, 30.0, 80.0, 200.0, 1000.0):
        ticks[t] = _sent(d.at(t).tick())
    # t=2: rate 0.1 x 0.8 + 0.2 x 2 = 0.48, tick peak 2/s, the window's 4 in 0.5 s = 8/s: 8
    # (unchanged); t=5: the window 3.92 (x 0.98) -> 7.84/s: 8; t=30: 3.8024 -> 7.6/s: 8;
    # t=80: 2.85 -> 5.7/s: 6; t=200: 1.43 -> 2.85/s: 3; t=1000: all forgotten: 0
    assert ticks == {2.0: [], 5.0: [], 30.0: [], 80.0: [("n0", 6)], 200.0: [("n0", 3)],
                     1000.0: [("n0", 0)]}
    pools = d.core.warm
    assert pools.rates == {"python": 0.0}
    assert pools.rate_peaks == {"python": 0.0} and pools.window_peaks == {"python": 0.0}


def test_a_second_burst_after_a_tick_is_sized_from_the_higher_of_the_two_peaks() -> None:
    d = Driver([cpu_node("n0", cpu=64)], policy="tangram", sandbox_cold_s=2.0, rate_window_s=10.0,
               peak_memory_s=100.0, min_warm_per_node=0, max_warm_per_node=1000)
    d.at(0.0).tick()
    assert _sent(d.at(0.5).arrive(_py("a0"))) == [("n0", 2), ("n0", 1)]  # 1 in 2 s, then 0.1/s
    d(ev.ActionsArrived(1.0, tuple(_py(f"b{i}") for i in range(8))))
    assert _last(d) == {"n0": 18}  # 9 in 2 s: 4.5/s x 2 x 2
    assert _sent(d.at(2.0).tick()) == []  # tick rate 4.5/s (9 in 2 s): 18
    assert d.core.warm.rate_peaks == {"python": 4.5}
    assert d.core.warm.rates["python"] == pytest.approx(0.98)  # 0.1 x 0.8 + 0.2 x 4.5
    # t=30: peak 4.5 x 0.72 = 3.24, the window 8.82 / 2 = 4.41/s: 18 still
    assert _sent(d.at(30.0).tick()) == []
    # a new arrival: 1 in the window (below its decayed peak): nothing is sent
    assert _sent(d.at(31.0).arrive(_py("c0"))) == []
    assert _sent(d.at(130.0).tick()) == [("n0", 13)]  # the window 6.35 / 2: 3.18/s x 4


def test_targets_over_three_nodes_are_resent_only_where_they_change() -> None:
    d = Driver([cpu_node("n0"), cpu_node("n1"), cpu_node("n2")], policy="tangram",
               sandbox_cold_s=1.0, rate_window_s=1000.0, peak_memory_s=1000.0, min_warm_per_node=0)
    d.at(0.0).tick()
    pools = d.core.warm
    assert _sent(d.at(0.0)(ev.Tick(0.0))) == []
    pools.spread("python", 0.5)  # want 1: n0 only (a target of 0 is not sent)
    assert _sent(d.core.st.out) == [("n0", 1)]
    d.core.st.out.clear()
    pools.spread("python", 1.5)  # want 3: one each
    assert _sent(d.core.st.out) == [("n1", 1), ("n2", 1)]
    d.core.st.out.clear()
    pools.spread("python", 2.5)  # want 5: 2, 2, 1
    assert _sent(d.core.st.out) == [("n0", 2), ("n1", 2)]
    d.core.st.out.clear()
    pools.spread("python", 2.0)  # want 4: 2, 1, 1
    assert _sent(d.core.st.out) == [("n1", 1)]
    d.core.st.out.clear()
    pools.spread("python", 4.0)  # want 8: 3, 3, 2
    assert _sent(d.core.st.out) == [("n0", 3), ("n1", 3), ("n2", 2)]
    d.core.st.out.clear()


def test_a_lost_node_gets_no_targets() -> None:
    d = Driver([cpu_node("n0"), cpu_node("n1")], policy="tangram", sandbox_cold_s=1.0,
               min_warm_per_node=0)
    d.at(0.0).tick()
    d(ev.NodeLost(0.5, "n1"))
    d(ev.ActionsArrived(1.0, tuple(_py(f"a{i}") for i in range(3))))
    assert set(_last(d)) == {"n0"} and _last(d)["n0"] == 6
