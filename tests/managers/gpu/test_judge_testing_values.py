"""Exact values of the packaged tiny generative judge (`managers/gpu/judge_testing.py`): where it
and its tokenizer are saved, the chat template's rendering, the saved config (head_dim 64 from
``hidden``, ``layers``), the seed, and that progress bars are off (issue 43 item 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arl_tangram.managers.gpu import judge_testing


def _build(root: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    path = judge_testing.build_tiny_genjudge(root / "model")
    bar_after = hf_logging.is_progress_bar_enabled()
    other = judge_testing.build_tiny_genjudge(str(root / "b"), seed=3, layers=3, hidden=192)
    return {"root": root, "path": path, "other": other, "bar_after": bar_after}


def _cfg(path: str) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())


def _weights(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def _check_paths(built: dict[str, Any]) -> None:
    root = built["root"]
    assert built["path"] == str(root / "model") and type(built["path"]) is str
    assert built["other"] == str(root / "b")
    assert (root / ".model-tokenizer" / "tokenizer.json").is_file()
    assert (root / ".b-tokenizer" / "tokenizer.json").is_file()
    assert (root / "model" / "tokenizer.json").is_file()
    assert built["bar_after"] is False


def _check_chat_template_renders_chatml(built: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built["path"], local_files_only=True)
    assert tok.chat_template == judge_testing.CHAT_TEMPLATE
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (len(tok), tok.pad_token_id, tok.eos_token_id) == (400, 0, 1)


def _check_saved_config_default_and_sized(built: dict[str, Any]) -> None:
    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "pad_token_id",
        "eos_token_id",
        "bos_token_id",
        "tie_word_embeddings",
    )
    cfg = _cfg(built["path"])
    assert [cfg[k] for k in keys] == [400, 128, 256, 2, 2, 2, 4096, 0, 1, 1, False]
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    big = _cfg(built["other"])
    assert [big[k] for k in keys] == [400, 192, 384, 3, 3, 3, 4096, 0, 1, 1, False]
    assert tuple(_weights(built["path"])["lm_head.weight"].shape) == (400, 128)


def _check_the_seed_is_the_one_given(built: dict[str, Any]) -> None:
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    for path, seed in ((built["path"], 0), (built["other"], 3)):
        cfg = AutoConfig.from_pretrained(path, local_files_only=True)
        torch.manual_seed(seed)
        ref = Qwen2ForCausalLM(cfg)
        got = _weights(path)
        assert torch.equal(got["model.embed_tokens.weight"], ref.model.embed_tokens.weight.detach())
        assert torch.equal(got["lm_head.weight"], ref.lm_head.weight.detach())


def test_built_judge_values(tmp_path: Path) -> None:
    """One test builds and checks everything (mutmut maps a mutant to the tests that call its
    function: a shared fixture would map the build to its first user only)."""
    built = _build(tmp_path)
    _check_paths(built)
    _check_chat_template_renders_chatml(built)
    _check_saved_config_default_and_sized(built)
    _check_the_seed_is_the_one_given(built)
