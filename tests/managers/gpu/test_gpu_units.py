"""GPU manager pieces that need no model: config validation, length grouping, the fit, batcher."""

from __future__ import annotations

import asyncio

import pytest

import arl_tangram.managers.gpu as gpu
from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import BatchOutcome, CostTracker, GpuManagerConfig, fit_alpha_beta
from arl_tangram.managers.gpu.batcher import DynamicBatcher
from arl_tangram.managers.gpu.scoring import micro_batches, texts_for


def test_exports_are_real() -> None:
    for name in gpu.__all__:
        assert getattr(gpu, name) is not None, name
    assert set(gpu.__all__) >= {"GpuManager", "GpuManagerConfig", "build_tiny_models"}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"device": "tpu"}, "device"),
        ({"cpu_devices": 0}, "cpu_devices"),
        ({"threads_per_device": 0}, "threads_per_device"),
        ({"host_park_limit_mb": -1}, "host_park_limit_mb"),
        ({"nvlink_domains": ((0, 1), (1, 2))}, "nvlink_domains"),
    ],
)
def test_config_errors_name_field_and_value(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        GpuManagerConfig(**kw)
    assert str(next(iter(kw.values())))[:3] in str(info.value)


def test_micro_batches_group_by_length_and_bound_tokens() -> None:
    lengths = [5, 100, 7, 98, 6, 99]
    groups = micro_batches(lengths, max_tokens=300, max_batch=64)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups[0] == [0, 4, 2]  # the short ones together
    for g in groups:
        assert len(g) * max(lengths[i] for i in g) <= 300 or len(g) == 1
    assert all(len(g) <= 2 for g in micro_batches(lengths, 10_000, 2))


def test_fit_alpha_beta_recovers_a_line() -> None:
    samples = [(n, 0.05 + 0.01 * n) for n in (1, 2, 4, 8, 16, 32)]
    alpha, beta = fit_alpha_beta(samples)  # type: ignore[misc]
    assert alpha == pytest.approx(0.05) and beta == pytest.approx(0.01)
    assert fit_alpha_beta([(4, 1.0), (4, 2.0)]) is None
    a2, b2 = fit_alpha_beta([(1, 1.0), (2, 0.5)])  # decreasing: beta clamps to 0
    assert b2 == 0.0 and a2 == pytest.approx(0.75)


def test_cost_tracker_priors_then_measurements() -> None:
    spec = ModelSpec("m", alpha=0.02, beta=0.002, load_s=9.0, max_batch=64)
    t = CostTracker(spec)
    f = t.fitted()
    assert (f["alpha"], f["beta"], f["load_s"], f["fitted"]) == (0.02, 0.002, 9.0, False)
    assert t.knee_batch() == 40
    for n in (1, 8, 32):
        t.add_batch(n, 0.1 + 0.001 * n)
    t.add_load(2.0, from_host=False)
    t.add_load(0.1, from_host=True)
    f = t.fitted()
    assert f["fitted"] and f["load_s"] == 2.0 and f["swap_s"] == 0.1
    assert t.knee_batch() == 64  # 4*0.1/0.001 = 400, capped at max_batch


def test_texts_for_kinds() -> None:
    sim = ModelSpec("s", kind="similarity")
    assert texts_for(sim, {"response": "a", "reference": "b"}) == ["a", "b"]
    with pytest.raises(ValueError, match="reference"):
        texts_for(sim, {"response": "a"})
    rm = ModelSpec("r")
    assert texts_for(rm, {"prompt": "p ", "response": "r"}) == ["p r"]
    assert texts_for(rm, {"query": "q"}) == ["q"]
    with pytest.raises(ValueError, match="query"):
        texts_for(rm, {"text": "x"})
    judge = ModelSpec("j", kind="judge", options={"template": "<{query}>"})
    assert texts_for(judge, {"query": "q"}) == ["<q>"]


def _action(i: int) -> ActionSpec:
    return ActionSpec(f"a{i}", kind=ActionKind.REWARD, model="m", payload={"query": str(i)})


async def test_batcher_merges_concurrent_submits_and_splits_results() -> None:
    seen: list[list[str]] = []

    async def run(iid: str, actions: list[ActionSpec]) -> BatchOutcome:
        seen.append([a.id for a in actions])
        await asyncio.sleep(0.01)
        outs = {a.id: {"score": float(a.payload["query"])} for a in actions if a.id != "a3"}
        return BatchOutcome(outs, {"a3": "boom"}, 0.01, len(outs))

    b = DynamicBatcher(run, knee=lambda iid: 8, wait_s=0.005)
    res = await asyncio.gather(
        *(b.submit("i", _action(i)) for i in range(20)), return_exceptions=True
    )
    assert [len(s) for s in seen] == [8, 8, 4]
    assert [x for s in seen for x in s] == [f"a{i}" for i in range(20)]  # arrival order
    for i, r in enumerate(res):
        if i == 3:
            assert isinstance(r, BrokenError) and "boom" in str(r)
        else:
            assert r == {"score": float(i)}
    await b.aclose()


async def test_batcher_whole_batch_failure_reaches_every_waiter() -> None:
    async def run(iid: str, actions: list[ActionSpec]) -> BatchOutcome:
        raise BrokenError("instance gone")

    b = DynamicBatcher(run, knee=lambda iid: 4, wait_s=0)
    res = await asyncio.gather(
        *(b.submit("i", _action(i)) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, BrokenError) and "gone" in str(r) for r in res)
    await b.aclose()


def test_fit_is_robust_to_noise_on_the_largest_batches() -> None:
    sizes = (1, 2, 4, 8, 16, 32, 64)
    samples = [(n, 0.05 + 0.002 * n) for n in sizes]
    samples[-1] = (64, samples[-1][1] * 1.3)  # a contention spike on the largest batch
    samples += [(1, 0.051)] * 20  # many small samples do not outweigh the other sizes
    alpha, beta = fit_alpha_beta(samples)  # type: ignore[misc]
    assert alpha == pytest.approx(0.05, rel=0.1)
    assert beta == pytest.approx(0.002, rel=0.3)


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    import torch

    from arl_tangram.managers.gpu import GpuManager

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BrokenError, match="cuda"):
        GpuManager(GpuManagerConfig(device="cuda"), [])
