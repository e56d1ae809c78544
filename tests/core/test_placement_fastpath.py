"""The hot-path placement code agrees with the plain definition of best fit.

`Placer.find_node` and `Placer.place_among` scan with `fit.best_fit` (over warm nodes, the free
index's buckets, a few given nodes). These tests compare them, on random cluster states,
with a direct transcription of the rule: among the candidate nodes that fit, the one with the
smallest ``(not warm, leftover dominant share)``, the first one on ties.
"""

from __future__ import annotations

import math
import random

import pytest

from arl_tangram.core import Core, CoreConfig
from arl_tangram.core.actions import ActionSpec, Status
from arl_tangram.core.cluster import ClusterSpec, NodeSpec
from arl_tangram.core.records import ActionRecord, NodeState
from arl_tangram.core.resources import Resources


def _leftover(node: NodeState, demand: Resources) -> float:
    worst = 0.0
    for k, v in demand.items():
        c = node.cap.get(k, 0.0)
        if c > 0:
            worst = max(worst, (node.free.get(k, 0.0) - v) / c)
    return worst


def _reference(core: Core, rec: ActionRecord) -> NodeState | None:
    """`find_node` as first written: fits(), then a tuple score, strict < keeps the first."""
    spec, demand = rec.spec, rec.spec.demand
    wkey = rec.wkey if core.placer.warm_nodes else ""
    best, best_score = None, (2, math.inf)
    ws = core.placer.warm_nodes.get(wkey)
    if ws and len(ws) <= 64:
        found = 0
        for name in ws:
            node = core.nodes[name]
            if node.alive and name not in core.st.reserved and node.fits(demand):
                score = (0, _leftover(node, demand))
                if score < best_score:
                    best, best_score = node, score
                found += 1
                if found >= core.config.fit_candidates:
                    break
        if best is not None:
            return best
    found = 0
    for name in core.st.index.from_level(demand.get("cpu")):
        node = core.nodes[name]
        if name in core.st.reserved or not node.fits(demand):
            continue
        score = (0 if node.warm.get(wkey) else 1, _leftover(node, demand))
        if score < best_score:
            best, best_score = node, score
        found += 1
        if found >= core.config.fit_candidates:
            return best
    del spec
    return best


def _random_core(rng: random.Random, dims: int) -> Core:
    nodes = []
    for i in range(40):
        cap = {"cpu": rng.choice([4, 8]), "memory_mb": 16384.0}
        if dims == 3:
            cap["gpu"] = rng.choice([0, 2])
        nodes.append(NodeSpec(f"n{i}", Resources(cap)))
    core = Core(ClusterSpec(tuple(nodes)), CoreConfig(policy="tangram"))
    for node in core.nodes.values():  # random load, random warm pools, a few reservations
        # whole units half the time, so that equal leftovers (ties) are common
        q = rng.random() < 0.5
        take = {k: (rng.randint(0, int(v) // 4) * 4 if q else rng.uniform(0, v))
                for k, v in node.cap.items()}
        node.take(take)
        core.st.index.update(node.name, node.free)
        if rng.random() < 0.3:
            core.placer.set_warm(node, "python", rng.randint(1, 3))
        if rng.random() < 0.1:
            core.st.reserved[node.name] = "someone"
    return core


@pytest.mark.parametrize("dims", [2, 3])
def test_find_node_matches_the_plain_rule(dims: int) -> None:
    rng = random.Random(dims)
    for trial in range(60):
        core = _random_core(rng, dims)
        for j in range(20):
            d = {"cpu": rng.choice([0.5, 1, 2, 4]), "memory_mb": rng.choice([1, 1024, 4096])}
            if dims == 3:
                d["gpu"] = rng.choice([1, 2])
            spec = ActionSpec(f"a{trial}-{j}", demand=Resources(d), tag=rng.choice(["python", "go"]))
            rec = ActionRecord(spec, 0.0, j)
            assert core.placer.find_node(rec) is _reference(core, rec)


def test_place_among_picks_the_plain_best_fit() -> None:
    rng = random.Random(7)
    for trial in range(200):
        core = _random_core(rng, 2)
        local = rng.sample(list(core.nodes.values()), 8)
        spec = ActionSpec(f"a{trial}", demand=Resources(cpu=rng.choice([1, 2]), memory_mb=1),
                          tag="python")
        rec = ActionRecord(spec, 0.0, 1)
        core.actions[spec.id] = rec
        rec.move(Status.QUEUED, 0.0, "test")
        core.queues.enqueue(rec)
        wkey = rec.wkey if core.placer.warm_nodes else ""
        fitting = [n for n in local if n.name not in core.st.reserved and n.fits(spec.demand)]
        want = min(fitting, key=lambda n: (0 if n.warm.get(wkey) else 1, _leftover(n, spec.demand)),
                   default=None)
        placed = core.placer.place_among(rec, local)
        assert placed == (want is not None)
        if want is not None:
            assert rec.node == want.name
