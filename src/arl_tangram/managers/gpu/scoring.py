"""Loading a reward model and scoring batches with it (synchronous; runs in the instance's
process, `worker.py`).

Invariant: the score of an input never depends on what else is in its batch. Inputs are grouped
by token length into micro-batches, right-padded with an attention mask, and every read of a
model output takes the row's own last real token (decoder models) or masks padding out of the
pooling (encoders). Results come back in the order the payloads were given.

Kinds:
- ``scalar``: AutoModelForSequenceClassification; score = the logit when num_labels == 1,
  else P(label ``options["positive_label"]``, default the last) and ``probs`` lists all.
- ``similarity``: AutoModel embeddings, masked mean pooling (L2-normalized), score = cosine
  similarity of the response and ``payload["reference"]``.
- a ``similarity`` model with ``options["index"]`` (a directory `tangram index build` wrote) is
  a local retriever (issue 37): each payload's ``query`` is embedded the same way and its
  ``topk`` nearest documents come back (`managers/retrieval/index.py`), batched like scores.
- ``judge``: AutoModelForCausalLM; score = P(yes) / (P(yes) + P(no)) of the next token after a
  prompt template (``options["template"]``, wrapped in the tokenizer's chat template when
  ``options["chat_template"]`` is true). Deterministic: one forward pass, no sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ...core.cluster import ModelSpec
from ...core.errors import BrokenError
from ...kinds import (
    Hit,
    RetrieveRequest,
    RetrieveResult,
    ScoreRequest,
    ScoreResult,
    retrieve_request,
    score_request,
)

Factory = Callable[[], tuple[Any, Any]]

DEFAULT_JUDGE_TEMPLATE = (
    "{query}\nIs the response above correct and helpful? Answer Yes or No.\nAnswer:"
)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _model_class(kind: str) -> Any:
    import transformers

    return {
        "scalar": transformers.AutoModelForSequenceClassification,
        "similarity": transformers.AutoModel,
        "judge": transformers.AutoModelForCausalLM,
    }[kind]


def cold_load(spec: ModelSpec, factory: Factory | None, device: torch.device) -> tuple[Any, Any]:
    """Build (model, tokenizer) from disk (or the factory) and put it on ``device``."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    where = "factory" if factory is not None else spec.path
    try:
        if factory is not None:
            model, tokenizer = factory()
        elif not spec.path:
            raise BrokenError(f"model {spec.name}: no path and no factory to load it from")
        else:
            dtype = _DTYPES.get(spec.dtype, "auto")
            tokenizer = transformers.AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
            model = _model_class(spec.kind).from_pretrained(
                spec.path, dtype=dtype, local_files_only=True
            )
        prepare(model, tokenizer)
        return model.to(device).eval(), tokenizer
    except BrokenError:
        raise
    except Exception as exc:  # any loader failure becomes a BrokenError with the reason
        raise BrokenError(
            f"model {spec.name}: cannot load from {where}: {type(exc).__name__}: {exc}"
        ) from exc


def prepare(model: Any, tokenizer: Any) -> None:
    """Padding that batching relies on: a pad token, right padding, the model knows the pad id."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise BrokenError("tokenizer has neither a pad nor an eos token; cannot batch")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id


# ---- payloads -> texts ------------------------------------------------------------------------


def _query(payload: Mapping[str, Any]) -> str:
    s = score_request(payload)
    if s.query is not None:
        return s.query
    if s.prompt is not None and s.response is not None:
        return f"{s.prompt}{s.response}"
    if s.response is not None:
        return s.response
    raise ValueError("payload needs 'query', or 'prompt' and 'response'")


def request_for(spec: ModelSpec, payload: Mapping[str, Any]) -> ScoreRequest | RetrieveRequest:
    """An action's payload as the typed request this model reads, parsed once (itself when it
    came typed: `kinds.ScoreRequest`, or `kinds.RetrieveRequest` for a retriever) and checked
    against what the model needs (`texts_for`); ValueError naming what it lacks. The manager
    calls it when a batch arrives and sends the typed requests to the instance's process, whose
    `Scorer` reads them without parsing again."""
    if spec.kind == "similarity" and spec.options.get("index"):  # a retriever
        return retrieve_request(payload)
    s = score_request(payload)
    texts_for(spec, s)
    return s


def texts_for(spec: ModelSpec, payload: Mapping[str, Any]) -> list[str]:
    """The texts one action contributes, from its typed request (`kinds.ScoreRequest`, or
    `kinds.RetrieveRequest` for a retriever; a plain mapping is parsed as one); raises
    ValueError naming what this model needs and the request lacks."""
    if spec.kind == "similarity" and spec.options.get("index"):  # a retriever
        return [retrieve_request(payload).query]
    s = score_request(payload)
    if spec.kind == "similarity":
        if s.reference is None:
            raise ValueError("a similarity reward needs 'reference' in the payload")
        resp = s.response if s.response is not None else s.query
        if resp is None:
            raise ValueError("a similarity reward needs 'response' (or 'query') in the payload")
        return [resp, s.reference]
    if spec.kind == "judge":
        template = str(spec.options.get("template", DEFAULT_JUDGE_TEMPLATE))
        if s.prompt is not None and s.response is not None and s.query is None:
            query = f"Question: {s.prompt}\nResponse: {s.response}"
        else:
            query = _query(s)
        return [template.format(query=query)]
    return [_query(s)]


# ---- forward passes ---------------------------------------------------------------------------


def micro_batches(lengths: Sequence[int], max_tokens: int, max_batch: int) -> list[list[int]]:
    """Indices grouped by length (ascending) so each group pads little; tokens per group bounded."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[i]  # ascending: the newest is the longest
        if cur and (len(cur) + 1 > max_batch or (len(cur) + 1) * longest > max_tokens):
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


class Scorer:
    """A loaded model with its tokenizer; turns payloads into scores."""

    def __init__(
        self, spec: ModelSpec, model: Any, tokenizer: Any, *, max_length: int, max_tokens: int
    ) -> None:
        self.spec, self.model, self.tokenizer = spec, model, tokenizer
        self.max_length, self.max_tokens = max_length, max_tokens
        self._yes_no: tuple[int, int] | None = None
        # judges of instruct models: wrap the prompt in the tokenizer's chat template
        self.chat = spec.kind == "judge" and bool(spec.options.get("chat_template", False))
        self.index: Any = None  # a retriever's index (`options["index"]`)
        if spec.kind == "similarity" and spec.options.get("index"):
            from ..retrieval.index import Index

            try:
                self.index = Index.load(str(spec.options["index"]))
            except ValueError as exc:
                raise BrokenError(f"model {spec.name}: {exc}") from exc
        if self.chat and not getattr(tokenizer, "chat_template", None):
            raise BrokenError(
                f"model {spec.name}: options.chat_template is set but its tokenizer has none"
            )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def score(self, payloads: Sequence[Mapping[str, Any]]) -> list[ScoreResult] | list[RetrieveResult]:
        """One outcome per payload, in order. Raises on a model failure (whole batch)."""
        if self.index is not None:
            return self.retrieve(payloads)
        uniq: dict[str, int] = {}  # identical texts (a shared reference) are encoded once
        refs: list[list[int]] = []
        for p in payloads:
            texts = [self._chat(t) for t in texts_for(self.spec, p)]
            refs.append([uniq.setdefault(t, len(uniq)) for t in texts])
        rows = self._forward_all(list(uniq))
        return [self._output([rows[i] for i in r]) for r in refs]

    def retrieve(self, payloads: Sequence[Mapping[str, Any]]) -> list[RetrieveResult]:
        """A retriever's batch: each request's ``query`` embedded, its ``topk`` (default 3)
        documents by exact inner product (`kinds.RetrieveResult`, best first)."""
        import numpy as np

        reqs = [retrieve_request(p) for p in payloads]
        rows = torch.stack(self._forward_all([r.query for r in reqs])).numpy().astype(np.float32)
        out: list[RetrieveResult] = []
        for i, r in enumerate(reqs):
            ids, scores = self.index.search(rows[i:i + 1], r.topk)
            hits = tuple(Hit(h["document"], h["score"]) for h in next(self.index.hits(ids, scores)))
            out.append(RetrieveResult(model=self.spec.name, hits=hits))
        return out

    def _chat(self, text: str) -> str:
        if not self.chat:
            return text
        messages = [{"role": "user", "content": text}]
        out = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return str(out)

    def _forward_all(self, texts: Sequence[str]) -> list[torch.Tensor]:
        tok = self.tokenizer
        special = not self.chat  # a chat template already carries its special tokens
        ids = tok(
            list(texts), truncation=True, max_length=self.max_length, add_special_tokens=special
        )["input_ids"]
        rows: list[torch.Tensor | None] = [None] * len(texts)
        groups = micro_batches([len(x) for x in ids], self.max_tokens, self.spec.max_batch * 2)
        device = self.device
        with torch.inference_mode():
            for group in groups:
                enc = tok(
                    [texts[i] for i in group],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    add_special_tokens=special,
                    return_tensors="pt",
                )
                batch = {k: v.to(device) for k, v in enc.items()}
                out = self._forward(batch).float().cpu()  # one device->host copy per group
                for j, i in enumerate(group):
                    rows[i] = out[j]
        return [r for r in rows if r is not None]

    def _forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        kind = self.spec.kind
        if kind == "scalar":
            return self.model(**batch).logits
        mask = batch["attention_mask"]
        if kind == "similarity":
            hidden = self.model(**batch).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)
        return self._judge_logits(batch)

    def _judge_logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Next-token logits at each row's last real token (lm head on those positions only)."""
        last = batch["attention_mask"].sum(1) - 1
        rows = torch.arange(last.shape[0], device=last.device)
        base = getattr(self.model, "base_model", None)
        head = self.model.get_output_embeddings()
        if base is not None and base is not self.model and head is not None:
            hidden = base(**batch).last_hidden_state
            return head(hidden[rows, last])
        return self.model(**batch).logits[rows, last]

    def _output(self, rows: Sequence[torch.Tensor]) -> ScoreResult:
        name, kind = self.spec.name, self.spec.kind
        if kind == "similarity":
            return ScoreResult(model=name, score=float(torch.dot(rows[0], rows[1])))
        logits = rows[0]
        if kind == "judge":
            yes, no = self.yes_no_ids()
            probs = torch.softmax(logits, -1)
            p_yes, p_no = float(probs[yes]), float(probs[no])
            return ScoreResult(model=name, score=p_yes / (p_yes + p_no), p_yes=p_yes, p_no=p_no)
        if logits.numel() == 1:
            return ScoreResult(model=name, score=float(logits[0]))
        probs = torch.softmax(logits, -1)
        pos = int(self.spec.options.get("positive_label", logits.numel() - 1))
        return ScoreResult(model=name, score=float(probs[pos]),
                           probs=tuple(float(x) for x in probs))

    def yes_no_ids(self) -> tuple[int, int]:
        if self._yes_no is None:
            opts = self.spec.options
            words = (str(opts.get("yes_token", " Yes")), str(opts.get("no_token", " No")))
            ids = []
            for w in words:
                toks = self.tokenizer.encode(w, add_special_tokens=False)
                if not toks:
                    raise BrokenError(f"model {self.spec.name}: tokenizer maps {w!r} to nothing")
                ids.append(int(toks[0]))
            if ids[0] == ids[1]:
                raise BrokenError(f"model {self.spec.name}: yes and no tokens are the same id")
            self._yes_no = (ids[0], ids[1])
        return self._yes_no
