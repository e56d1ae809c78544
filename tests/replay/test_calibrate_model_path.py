"""`tangram calibrate`'s engine cost of a model action (issue 39): real models on a real embedded
engine, one action at a time, the model's own batch latency taken off, per kind, never below 0."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from arl_tangram.replay import calibrate as cal


def test_a_model_actions_engine_cost_per_kind_less_its_batch_latency(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from arl_tangram.managers.gpu.testing import build_tiny_models, tiny_model_specs

    paths = build_tiny_models(tmp_path, seed=0)
    specs = {m.name: m for m in tiny_model_specs(paths)}
    # a reward model whose batch latency (alpha + beta) is far above any engine round trip
    # (clamped to 0), and a judge whose latency is 0 (its whole submit -> delivered is the engine's)
    rm = dataclasses.replace(specs["tiny-rm"], alpha=0.0, beta=30.0)
    judge = dataclasses.replace(specs["tiny-judge"], alpha=0.0, beta=0.0)
    said: list[str] = []
    got = asyncio.run(cal._model_dispatch([rm, judge], said.append, 2))
    assert list(got) == ["reward", "judge"]
    assert got["reward"] == 0.0
    assert got["judge"] > 0.0
    assert said == [
        "engine cost of one model action beyond its batch latency: reward 0.0 ms, "
        f"judge {1000 * got['judge']:.1f} ms"
    ]


def test_a_model_action_that_fails_stops_the_calibration_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from arl_tangram.core.cluster import ModelSpec

    bad = ModelSpec("gone-rm", kind="scalar", path=str(tmp_path / "no-such-model"))
    with pytest.raises(RuntimeError) as info:
        asyncio.run(cal._model_dispatch([bad], lambda m: None, 1))
    assert str(info.value).startswith(
        "calibration action of gone-rm ended FAILED: model gone-rm failed to load 3 times: "
    )
