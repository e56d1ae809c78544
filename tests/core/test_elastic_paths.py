"""elastic.py's shortcuts do what the plain loops do: warm-pool spreads, expansion scans."""

from __future__ import annotations

import heapq
import math
import random
import types

import pytest
from core_helpers import Driver, act, cpu_node, elastic

from arl_tangram.core import commands as cmd
from arl_tangram.core import elastic as elastic_mod
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionSpec, Status, WorkHints
from arl_tangram.core.cluster import NodeSpec
from arl_tangram.core.resources import CPU, Resources


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


def _expand_node_steps(self, node) -> None:
    """`Elastic.expand_node` as it was: every step a turn of the heap (the action given a step
    pushed back with its work left, popped again; the fast path gives it its steps in a row)."""
    step = self.st.config.elastic_step
    growable = self.placer.growable.get(node.name)
    heap = []
    for aid in list(growable) if growable else ():
        rec = self.st.actions.get(aid)
        if rec is None or aid not in node.running or rec.allotment is None or not rec.elastic:
            del growable[aid]
            continue
        el = rec.spec.elasticity
        if rec.allotment.get(el.dim) >= el.max - 1e-9:
            del growable[aid]
            continue
        heap.append((self.remaining(rec), rec.seq, aid))
    if not heap:
        if not node.elastic:
            self.st.elastic_nodes.discard(node.name)
        return
    heapq.heapify(heap)
    changed = {}
    while heap:
        _, _, aid = heapq.heappop(heap)
        rec = self.st.actions[aid]
        el = rec.spec.elasticity
        spare = node.free.get(el.dim, 0.0) - self.reserve_of(node, el.dim)
        k = rec.allotment.get(el.dim)
        delta = min(el.max - k, spare, step)
        if delta <= 1e-9 or elastic_mod._gain(rec, delta) <= 0.0:
            continue
        if node.spec.parallel_speedup and self.node_gain(node, rec, delta) <= 0.0:
            continue
        self.retime(rec)
        node.take({el.dim: delta})
        if self.st.fair:
            self.st.tenant_take(rec.tenant, {el.dim: delta}, 1.0)
        rec.allot(rec.allotment.with_amount(el.dim, k + delta))
        changed[aid] = rec
        if k + delta < el.max - 1e-9:
            heapq.heappush(heap, (self.remaining(rec), rec.seq, aid))
    if changed:
        self.st.index.update(node.name, node.free)
        self.emit_resizes(node, changed.values())


def _pair(nodes, **cfg):
    fast, plain = Driver(nodes, **cfg), Driver(nodes, **cfg)
    plain.core.warm.spread = types.MethodType(_spread_warm_plain, plain.core.warm)
    plain.core.elastic.expand = types.MethodType(_expand_plain, plain.core.elastic)
    return fast, plain


def _run(seed: int, fast: Driver, plain: Driver, n_nodes: int, cpus=(1,)) -> None:
    rng = random.Random(seed)
    live: list[str] = []
    t = 0.0
    for i in range(500):
        t += rng.expovariate(rng.choice((2.0, 20.0, 200.0)))
        r = rng.random()
        if r < 0.5:
            lang = rng.choice(("python", "python", "cpp"))
            spec = (elastic(f"e{i}", 1, rng.choice((2, 4)), payload={"language": lang})
                    if rng.random() < 0.3 else act(f"a{i}", rng.choice(cpus), payload={"language": lang}))
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


@pytest.mark.pure_core  # (replaces three methods of one core)
def test_expansion_gives_steps_in_a_row_as_the_heap_did() -> None:
    """An action given a step keeps its work left, so it is the heap's least again: its steps
    in a row decide what the heap's turns did, with fractional spare CPU (rigid actions of 0.5
    and 1.5 cores) and on a node with a measured parallel speedup (`node_gain` per step)."""
    for seed in range(4, 10):
        nodes = [cpu_node(f"n{i}", cpu=4) for i in range(4)]
        nodes.append(NodeSpec("n4", Resources(cpu=6, memory_mb=8192), pool="cpu",
                              parallel_speedup=((2.0, 1.9), (4.0, 3.2), (6.0, 4.0))))
        fast, plain = _pair(nodes, policy="tangram", sandbox_cold_s=1.0, max_warm_per_node=3,
                            rate_window_s=2.0)
        plain.core.elastic.expand_node = types.MethodType(_expand_node_steps, plain.core.elastic)
        _run(seed, fast, plain, 4, cpus=(0.5, 1, 1.5))
        grown = [c for c in fast.log if isinstance(c, cmd.ResizeAction)]
        assert grown and any(c.node == "n4" for c in grown)


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


def test_a_resize_is_told_in_the_story_with_its_dimension_and_width() -> None:
    d = Driver([cpu_node("n0", cpu=4)], policy="tangram")
    d.arrive(act("a", 2), elastic("e", 1, 4))
    out = [c for c in d.finish("a") if isinstance(c, cmd.ResizeAction)]
    assert [(c.action_id, c.allotment.get(CPU)) for c in out] == [("e", 4.0)]
    assert d.core.story("e") == [
        "t=0 arrived (cause e)", "t=0 PENDING->QUEUED (cause e)",
        "t=0 QUEUED->STARTING (cause ActionArrived:e)",  # (at 2 cores: "a" holds the others)
        "t=0 allotment cpu -> 4 (cause ActionFinished:a)"]
    assert out[0].allotment.get("memory_mb") == 256.0  # (the other dimensions stay)


@pytest.mark.pure_core  # (counts the heap's pops through elastic's `heapq`: the pure module)
def test_expansion_stops_at_the_first_action_that_finds_no_spare_cpu(monkeypatch) -> None:
    """Two tests below their maximum; one core frees: the one with the least work left takes
    it, and the expansion stops there: one pop, not one per action below its maximum."""
    d = Driver([cpu_node("n0", cpu=16)], policy="tangram")
    d.arrive(act("r", 4), *[elastic(f"e{i}", 1, 4, hints=WorkHints(expected_s=10.0 + i))
                            for i in range(4)])
    d.at(0.1).finish("r", run_s=0.1)  # its 4 cores: e0..e3 at 4 each (16 in all)
    d.at(0.2).arrive(act("s", 3))  # 3 lent cores back from e3, the most work left
    d.at(0.3).arrive(act("t", 1))  # e3 at its minimum: e2 lends one
    assert [d.core.st.actions[f"e{i}"].width for i in range(4)] == [4.0, 4.0, 3.0, 1.0]
    pops = []
    real = heapq.heappop
    monkeypatch.setattr(elastic_mod, "heapq", types.SimpleNamespace(
        heappop=lambda h: pops.append(1) or real(h), heappush=heapq.heappush, heapify=heapq.heapify))
    out = d.at(0.4).finish("t", run_s=0.1)  # one core: e2 (less work left than e3) takes it
    assert [(c.action_id, c.allotment.get(CPU)) for c in out if isinstance(c, cmd.ResizeAction)] == [("e2", 4.0)]
    assert len(pops) == 1  # then no spare: e3 is not popped
