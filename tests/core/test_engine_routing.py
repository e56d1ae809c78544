"""Routing to judge engines (issue 38, docs/core.md "Routing to judge engines"): which instance
each action joins, pinned in small cases, under each ``CoreConfig.engine_routing``."""

from __future__ import annotations

import pytest
from core_helpers import Driver, gpu_node, of

from arl_tangram.core import commands as cmd
from arl_tangram.core import events as ev
from arl_tangram.core.actions import ActionKind, ActionSpec, WorkHints
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.config import CoreConfig
from arl_tangram.core.resources import Resources

# one step alone 0.011 s; 1 ms of prefill per prompt token; 4 sequences per instance
ENGINE = ModelSpec("gj", kind="genjudge", memory_mb=8000, alpha=0.01, beta=0.001, max_batch=4,
                   max_instances=3, load_s=5.0, max_seqs=4, prefill_s=0.001)


def judge(aid: str, traj: str | None, prompt: int | None, expected_s: float = 1.0) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.JUDGE, model="gj", demand=Resources(), trajectory=traj,
                      hints=WorkHints(expected_s=expected_s, prompt_tokens=prompt))


def engines(routing: str, model: ModelSpec = ENGINE) -> tuple[Driver, list[str]]:
    """Three ready instances of ``model`` (ids in order), nothing in flight."""
    d = Driver([gpu_node("g0", gpus=3)], [model], policy="tangram", engine_routing=routing)
    loads = of(d.tick(), cmd.LoadModel)
    for ld in loads:
        d(ev.ModelLoaded(1.0, ld.instance_id))
    return d, [ld.instance_id for ld in loads]


def where(out: list[cmd.Command]) -> dict[str, str]:
    """Action id -> the instance its RunBatch went to."""
    return {a.id: b.instance_id for b in of(out, cmd.RunBatch) for a in b.actions}


def test_cost_stays_sticky_while_the_prefill_saved_outweighs_the_wait() -> None:
    d, (i1, i2, i3) = engines("cost")
    # nothing cached anywhere: the least loaded, the first in id order on a tie
    assert where(d.arrive(judge("t0", "t", 1000))) == {"t0": i1}
    assert where(d.arrive(judge("u0", "u", 1000))) == {"u0": i2}
    assert where(d.arrive(judge("x0", "x", 1000))) == {"x0": i3}
    # t's next prompt extends its first (1,000 of 1,100 tokens cached on i1). On i1 (1 in
    # flight) it costs 2 x 1 ms x 100 + 2 x 1 ms x (1 s / 11 ms) x 1 = 0.38 s; on i2 or i3 (1 in
    # flight, nothing cached) 2 x 1 ms x 1,100 + 0.18 = 2.38 s: it stays on i1
    assert where(d.arrive(judge("t1", "t", 1100))) == {"t1": i1}
    # i1 now has 2 in flight, i2 and i3 one; a short extension of a short prompt is not worth
    # the extra sharing: v0 (200 tokens) to i2, then v1 (250 tokens, 200 cached on i2, which
    # has 2 in flight): 3 x 50 ms + 2 x 1 ms x 90.9 x 2 = 0.51 s on i2 against 2 x 250 ms
    # + 0.18 s = 0.68 s on i3: sticky; v2 (260 tokens): on i2 (3 in flight) 4 x 10 ms + 0.55 s
    # = 0.59 s, on i3 2 x 260 ms + 0.18 s = 0.70 s: sticky; v3 (265 tokens): i2 is full (4)
    assert where(d.arrive(judge("v0", "v", 200))) == {"v0": i2}
    assert where(d.arrive(judge("v1", "v", 250))) == {"v1": i2}
    assert where(d.arrive(judge("v2", "v", 260))) == {"v2": i2}
    assert where(d.arrive(judge("v3", "v", 265))) == {"v3": i3}
    # i1 and i3 have 2 in flight each: w0 to i1 (the first); w1 extends it by 10 tokens but
    # expects 10 s alone (909 steps): on i1 (3 in flight) 4 x 10 ms + 2 x 1 ms x 909 x 3 =
    # 5.49 s, on i3 (2) 3 x 310 ms + 2 x 1 ms x 909 x 2 = 4.57 s: the sharing it would add on
    # i1 costs more than the prefill it saves there
    assert where(d.arrive(judge("w0", "w", 300))) == {"w0": i1}
    assert where(d.arrive(judge("w1", "w", 310, expected_s=10.0))) == {"w1": i3}


def test_cost_without_prefix_is_least_loaded() -> None:
    d, (i1, i2, i3) = engines("cost")
    out = d(ev.ActionsArrived(0.0, tuple(judge(f"a{i}", None, 500) for i in range(5))))
    assert where(out) == {"a0": i1, "a1": i2, "a2": i3, "a3": i1, "a4": i2}


def test_sticky_follows_the_trajectory_until_its_instance_is_full() -> None:
    d, (i1, i2, i3) = engines("sticky")
    assert where(d.arrive(judge("t0", "t", 10))) == {"t0": i1}
    assert where(d.arrive(judge("u0", "u", 10))) == {"u0": i2}
    # sticky whatever the loads: t's requests all go to i1 until it is full
    out = d(ev.ActionsArrived(0.0, tuple(judge(f"t{i}", "t", 10 + i) for i in range(1, 5))))
    assert where(out) == {"t1": i1, "t2": i1, "t3": i1, "t4": i3}
    # t4 went to i3 (the least loaded): t sticks to i3 from now on
    assert where(d.arrive(judge("t5", "t", 20))) == {"t5": i3}


def test_round_robin_and_least_loaded() -> None:
    d, (i1, i2, i3) = engines("round-robin")
    out = d(ev.ActionsArrived(0.0, tuple(judge(f"a{i}", "t", 10 + i) for i in range(4))))
    assert where(out) == {"a0": i1, "a1": i2, "a2": i3, "a3": i1}
    assert where(d.arrive(judge("b0", "t", 20))) == {"b0": i2}
    d, (i1, i2, i3) = engines("least-loaded")
    assert where(d.arrive(judge("t0", "t", 10))) == {"t0": i1}
    # a trajectory's second request goes wherever fewest sequences are, not to its first's
    assert where(d.arrive(judge("t1", "t", 20))) == {"t1": i2}


def test_one_batch_per_instance_per_pass() -> None:
    d, (i1, i2, _i3) = engines("sticky")
    assert where(d.arrive(judge("t0", "t", 10))) == {"t0": i1}
    out = d(ev.ActionsArrived(0.0, (judge("t1", "t", 11), judge("u0", "u", 5),
                                    judge("t2", "t", 12))))
    batches = of(out, cmd.RunBatch)
    assert [(b.instance_id, [a.id for a in b.actions]) for b in batches] == [
        (i1, ["t1", "t2"]), (i2, ["u0"])]


def test_engine_routing_is_validated() -> None:
    with pytest.raises(ValueError, match="engine_routing"):
        CoreConfig(engine_routing="random")
