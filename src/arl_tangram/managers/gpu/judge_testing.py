"""A tiny generative judge for tests and benchmarks of the judge engine (issue 38).

Built here, never fetched: a Qwen2-style causal LM from a config with seeded random weights
(head_dim 64: vLLM's CPU attention refuses smaller heads) and the byte-level BPE tokenizer of
`testing.build_tokenizer` with a chat template, saved with ``save_pretrained`` into one directory,
which the engine then loads as it loads a user's model. Random weights generate garbage: what
it says is only good for testing the verdict rules' handling of garbage.
"""

from __future__ import annotations

from pathlib import Path

from .testing import build_tokenizer

# ChatML, as Qwen2's instruct models use (a user's model brings its own)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_genjudge(directory: str | Path, *, seed: int = 0, layers: int = 2,
                        hidden: int = 128) -> str:
    """Save a tiny random Qwen2 causal LM with its tokenizer in ``directory``; its path."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(directory)
    tok_dir = out.parent / f".{out.name}-tokenizer"
    build_tokenizer(tok_dir)
    tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    tok.chat_template = CHAT_TEMPLATE
    cfg = Qwen2Config(  # head_dim = hidden / heads = 64
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
        max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)
