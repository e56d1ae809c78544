"""elastic.py's shortcuts do what the plain loops do: warm-pool spreads, expansion scans."""

from __future__ import annotations

import math
import random
import types

import pytest
from core_helpers import Driver, act, cpu_node, elastic

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.resources import CPU


def _spread_warm_plain(self, key: str, rate: float) -> None:
    """`WarmPools.spread` as a plain loop: every node of the spread visited on every change of
    want (the fast path visits only the nodes whose target can differ)."""
    names = self.cpu_nodes()
    if not names:
        return
    cfg = self.st.config
    n = len(names)
    want = math.ceil(rate * cfg.sandbox_cold_s * 2)
    if rate * cfg.rate_window_s >= 1.0:
        want = max(want, cfg.min_warm_per_node * n)
    if self.spread_want.get(key) == want:
        return
    self.spread_want[key] = want
    for i, name in enumerate(names):
        t = min(cfg.max_warm_per_node, want // n + (1 if i < want % n else 0))
        if self.sent.get((name, key), 0) != t:
            self.sent[(name, key)] = t
            self.st.out.append(cmd.ResizeWarmPool(name, key, t, cause=self.st.cause))


def _expand_plain(self) -> None:
    """`Elastic.expand` as a plain loop: every changed node scanned, elastic actions or not
    (the fast path visits only the nodes that hold elastic actions)."""
    st = self.st
    nodes = st.expand_at | st.dirty
    st.expand_at.clear()
    for name in sorted(nodes) if len(nodes) > 1 else nodes:
        node = st.nodes.get(name)
        if node is None or not node.alive or name in st.reserved:
            continue
        if node.running:  # (the per-node pass is shared: only which nodes are visited differs)
            self.expand_node(node)


def _pair(nodes, **cfg):
    fast, plain = Driver(nodes, **cfg), Driver(nodes, **cfg)
    plain.core.warm.spread = types.MethodType(_spread_warm_plain, plain.core.warm)
    plain.core.elastic.expand = types.MethodType(_expand_plain, plain.core.elastic)
    return fast, plain


def _run(seed: int, fast: Driver, plain: Driver, n_nodes: int) -> None:
    rng = random.Random(seed)
    live: list[str] = []
    t = 0.0
    for i in range(500):
        t += rng.expovariate(rng.choice((2.0, 20.0, 200.0)))
        r = rng.random()
        if r < 0.5:
            lang = rng.choice(("python", "python", "cpp"))
            spec = (elastic(f"e{i}", 1, rng.choice((2, 4)), payload={"language": lang})
                    if rng.random() < 0.3 else act(f"a{i}", payload={"language": lang}))
            events = [ev.ActionArrived(t, spec)]
            live.append(spec.id)
        elif r < 0.85 and live:
            aid = live.pop(rng.randrange(len(live)))
            events = [ev.ActionFinished(t, aid, Status.SUCCEEDED, run_s=0.1)]
        elif r < 0.97:
            events = [ev.Tick(t)]
        elif r < 0.985:
            events = [ev.NodeLost(t, f"n{rng.randrange(n_nodes)}", "test")]
        else:
            events = [ev.NodeAdded(t, cpu_node(f"n{rng.randrange(n_nodes)}", cpu=4))]
        for e in events:
            a, b = fast.at(t)(e), plain.at(t)(e)
            assert repr(a) == repr(b), (seed, i, e)
    assert any(isinstance(c, cmd.ResizeWarmPool) for c in fast.log)
    assert any(isinstance(c, cmd.ResizeAction) or (isinstance(c, cmd.StartAction) and
               c.allotment.get(CPU) > c.action.demand.get(CPU)) for c in fast.log)


@pytest.mark.pure_core  # (replaces two methods of one core: see tests/conftest.py)
def test_warm_spreads_and_expansion_match_the_plain_loops() -> None:
    for seed in range(4):
        nodes = [cpu_node(f"n{i}", cpu=4) for i in range(5)]
        fast, plain = _pair(nodes, policy="tangram", sandbox_cold_s=1.0, max_warm_per_node=3,
                            rate_window_s=2.0)
        _run(seed, fast, plain, 5)


def test_a_node_without_elastic_actions_leaves_the_expansion_set() -> None:
    d = Driver([cpu_node("n0", cpu=8)], policy="tangram")
    d.arrive(elastic("e", 1, 4), act("a"))
    assert d.core.st.elastic_nodes == {"n0"}
    d.finish("e")  # the pass over n0 finds only "a" running, not elastic: dropped
    assert d.core.st.elastic_nodes == set()
    out = d.arrive(ActionSpec("x"), elastic("e2", 1, 4))
    assert d.core.st.elastic_nodes == {"n0"}
    assert [c.allotment.get(CPU) for c in of_start(out) if c.action.id == "e2"] == [4.0]


def of_start(cmds):
    return [c for c in cmds if isinstance(c, cmd.StartAction)]
