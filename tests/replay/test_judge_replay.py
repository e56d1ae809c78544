"""A judge trace replayed on an engine (issue 38): what each judgement asks the engine for, what
the prediction charges it, and a replay that starts once the core's first instances are loaded
(the simulator's set-up, which no ACT includes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arl_tangram.core.actions import ActionKind, WorkHints
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.resources import Resources
from arl_tangram.replay.driver import action_payload
from arl_tangram.replay.predict import measured_trace
from arl_tangram.sim.trace import SimAction, Trajectory

ENGINE = ModelSpec("gj", kind="genjudge", alpha=0.002, beta=0.0005, max_seqs=8, max_batch=8)
SCALAR = ModelSpec("rm", kind="scalar", alpha=0.002, beta=0.0001)


def _judge(tokens: int | None, model: str = "gj") -> SimAction:
    return SimAction(ActionKind.JUDGE if model == "gj" else ActionKind.REWARD, 9.0, Resources(),
                     hints=WorkHints(tokens=tokens), model=model)


def test_a_judgement_on_an_engine_asks_for_exactly_its_tokens() -> None:
    got = action_payload(_judge(37), ENGINE, 1000.0, 1, in_session=False)
    assert got == {"openai": {"route": "completions", "body": {
        "prompt": "Is this correct? The answer is 4 because 2 + 2 = 4.", "max_tokens": 37,
        "temperature": 0.0, "ignore_eos": True}}}
    # no tokens in the trace: a plain judgement (the model's own max_tokens)
    assert action_payload(_judge(None), ENGINE, 1000.0, 1, in_session=False) == {
        "query": "The answer is 4 because 2 + 2 = 4."}


def test_the_prediction_charges_an_engine_judgement_its_tokens_at_the_step_alone() -> None:
    cluster = ClusterSpec((NodeSpec("n", Resources(cpu=2, gpu=1)),), (ENGINE, SCALAR))
    traj = Trajectory("t", "judge", ((0.1, _judge(37)), (0.1, _judge(None)),
                                     (0.1, _judge(12, model="rm"))), 0.0, {}, 0)
    (batch,) = measured_trace([[traj]], cluster, {})
    works = [a.work_s for _, a in batch[0].steps]
    # 37 tokens x (alpha + beta); without tokens, and on a forward-pass model, its beta
    assert works == [pytest.approx(37 * 0.0025, rel=1e-12), 0.0005, 0.0001]


@pytest.mark.needs_root
def test_a_replay_starts_once_the_first_instances_are_loaded(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from arl_tangram.core.errors import IsolationUnavailable
    from arl_tangram.managers.gpu.testing import build_tiny_models
    from arl_tangram.replay.backends import EmbeddedBackend
    from arl_tangram.replay.driver import _settle

    paths = build_tiny_models(tmp_path, seed=0)
    rm = ModelSpec("tiny-rm", kind="scalar", path=paths["scalar"], memory_mb=64, load_s=0.1,
                   alpha=0.002, beta=0.0001)
    cluster = ClusterSpec((NodeSpec("local", Resources(cpu=2, memory_mb=4096, gpu=1,
                                                       gpu_memory_mb=1024)),), (rm,))

    async def go() -> list[tuple[str, str]]:
        b = EmbeddedBackend(cluster, "tangram", 1, {}, tick_s=0.02)  # (checked while loading)
        try:
            await b.start()
        except IsolationUnavailable as e:
            pytest.skip(f"isolation unavailable here: {e}")
        try:
            await _settle(b)
            return [(i.model, i.state) for i in b.engine.cluster_view().instances]
        finally:
            await b.aclose()

    # the core loads one instance at its first events (model_min_instances); the replay's
    # first arrival waits for it
    assert asyncio.run(go()) == [("tiny-rm", "ready")]


def test_calibration_fits_the_engine_step_over_widths(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """`tangram calibrate --judge-engine`: the engine's start and its step fitted over widths
    up to 32 requests of 64 tokens, five times each (median per width), into the spec the simulator reads (the
    engine itself is measured in tests/managers/gpu/test_judge_engine.py)."""
    from arl_tangram.managers.gpu import engine_judge
    from arl_tangram.replay import calibrate

    calls: list[tuple] = []

    class Host:
        def __init__(self, specs: list[ModelSpec]) -> None:
            calls.append(("host", [s.name for s in specs]))

        async def load(self, iid: str, model: str, devices: tuple[int, ...]) -> float:
            calls.append(("load", iid, model, devices))
            return 21.234

        async def step_costs(self, iid: str, **kw: int) -> tuple[float, float, float, float]:
            calls.append(("steps", iid, kw))
            return 0.0027, 0.00019, 0.0029, 0.0089

        async def aclose(self) -> None:
            calls.append(("close",))

    monkeypatch.setattr(engine_judge, "EngineJudgeHost", Host)
    (tmp_path / "genjudge").mkdir()
    (tmp_path / "genjudge" / "config.json").write_text("{}")  # (no model built: the host is fake)
    spec = asyncio.run(calibrate._judge_engine_figures(tmp_path, lambda m: None))
    assert calls == [("host", ["tiny-genjudge"]), ("load", "cal-gj", "tiny-genjudge", (0,)),
                     ("steps", "cal-gj", {"k": 32, "tokens": 64, "repeats": 5}), ("close",)]
    assert (spec.name, spec.kind, spec.load_s, spec.alpha, spec.beta, spec.max_seqs) == (
        "tiny-genjudge", "genjudge", 21.23, 0.0027, 0.00019, 64)
