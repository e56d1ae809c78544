"""The simulator's judge engine (issue 38, sim/engine_model.py): batches on an instance of a model
with ``max_seqs > 0`` share it step by step (processor sharing at ``(alpha + beta) /
(alpha + beta * k)`` with k sequences), exact finish times."""

import pytest

from arl_tangram.core import commands as C
from arl_tangram.core import events as E
from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.sim.engine_model import EngineState
from arl_tangram.sim.executor import VirtualExecutor
from arl_tangram.sim.loop import EventLoop
from arl_tangram.sim.metrics import UsageMeter
from arl_tangram.sim.trace import SimAction

GJ = ModelSpec("gj", kind="genjudge", alpha=0.003, beta=0.0003, max_seqs=8, load_s=1.0)
CLUSTER = ClusterSpec((NodeSpec("n0", Resources(cpu=8, memory_mb=8192, gpu=1,
                                                gpu_memory_mb=20000)),), (GJ,))


def _spec(aid: str) -> ActionSpec:
    return ActionSpec(aid, ActionKind.JUDGE, Resources(), model="gj")


def test_a_joining_batch_shares_the_instance_and_finishes_first() -> None:
    truth = {"x": SimAction(ActionKind.JUDGE, 1.0, model="gj"),
             "y": SimAction(ActionKind.JUDGE, 0.2, model="gj", fails=True)}
    loop = EventLoop()
    events: list[E.Event] = []
    usage = UsageMeter(CLUSTER.total_capacity(), lambda: loop.now)
    ex = VirtualExecutor(loop, CLUSTER, truth, events.append, usage=usage)
    ex.execute(C.LoadModel("i0", "gj", "n0", (0,)))
    ex.execute(C.RunBatch("b0", "i0", "n0", "gj", (_spec("x"),)))  # starts at the load, 1.0
    loop.at(1.5, ex.execute, C.RunBatch("b1", "i0", "n0", "gj", (_spec("y"),)))
    loop.run()
    loaded, b1, b0 = events
    assert isinstance(loaded, E.ModelLoaded) and loaded.time == pytest.approx(1.0)
    r2 = 0.0033 / 0.0036  # each of two sequences' rate
    # x alone 1.0-1.5 (0.5 left); both until y's 0.2 is done; then x alone for its last 0.3
    assert isinstance(b1, E.BatchFinished) and b1.batch_id == "b1"
    assert b1.time == pytest.approx(1.5 + 0.2 / r2) and b1.latency_s == pytest.approx(0.2 / r2)
    assert set(b1.failed) == {"y"} and not b1.outputs
    assert b0.batch_id == "b0" and set(b0.outputs) == {"x"}
    assert b0.time == pytest.approx(1.5 + 0.2 / r2 + 0.3)
    assert b0.latency_s == pytest.approx(b0.time - 1.0)


def test_rate_against_sequences_in_flight() -> None:
    st = EngineState(0.003, 0.0003)
    assert st.rate() == 1.0
    st.remaining = dict.fromkeys("abcdefgh", 1.0)
    assert st.rate() == pytest.approx(0.0033 / (0.003 + 0.0003 * 8))
    # tokens per second grow with the batch, toward 1/beta: 8 sequences give 8 * rate
    assert 8 * st.rate() == pytest.approx(4.888888, rel=1e-6)


def test_genrm_engine_workload_and_its_bound() -> None:
    """The genrm-engine workload's judge (docs/workloads.md) and what the bound charges it."""
    import random

    from arl_tangram.sim.bounds import action_bound, gpu_charge
    from arl_tangram.sim.workloads import ENGINE_JUDGE_MODEL as M
    from arl_tangram.sim.workloads import WORKLOADS, genrm_engine

    assert (M.kind, M.max_seqs, M.alpha, M.beta) == ("genjudge", 64, 0.0055, 0.00025)
    t = genrm_engine(random.Random(0), 0, 0)
    ((_gen, act),) = t.steps
    tokens = act.hints.tokens
    assert tokens is not None and 64 <= tokens <= 4096
    assert act.work_s == pytest.approx(tokens * 0.00575)
    cluster = WORKLOADS["genrm-engine"].cluster(256)
    assert action_bound(act, cluster, {}) == pytest.approx(act.work_s)  # no batch cost alone
    assert gpu_charge(act, cluster) == pytest.approx(act.work_s * (0.0055 + 0.016) / (64 * 0.00575))
