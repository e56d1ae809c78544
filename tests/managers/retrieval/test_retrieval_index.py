"""The local retriever's index (issue 37 item 4): exact inner-product search, the same top k
with FAISS and with numpy; the corpus's errors name the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from arl_tangram.managers.retrieval.index import FORMAT, Index, RetrievalIndexError, read_corpus


def _index(tmp_path: Path, emb: np.ndarray) -> Path:
    p = tmp_path / "ix"
    p.mkdir()
    np.save(p / "embeddings.npy", emb.astype(np.float32))
    (p / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": f"T{i}\nx"}) + "\n"
                                            for i in range(len(emb))))
    (p / "meta.json").write_text(json.dumps({"format": FORMAT, "name": "ix", "rows": len(emb),
                                             "dim": emb.shape[1]}))
    return p


def test_faiss_and_numpy_return_the_same_exact_top_k(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(500, 32)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    q = rng.normal(size=(20, 32)).astype(np.float32)
    ix = Index.load(_index(tmp_path, emb))
    assert ix.backend == "faiss.IndexFlatIP"
    rows_f, scores_f = ix.search(q, 5)
    ix._faiss = None
    rows_n, scores_n = ix.search(q, 5)
    assert (rows_f == rows_n).all()
    np.testing.assert_allclose(scores_f, scores_n, rtol=1e-5, atol=1e-6)
    brute = np.argsort(-(q @ emb.T), axis=1, kind="stable")[:, :5]
    assert (rows_n == brute).all()
    assert ix.search(q[:1], 10_000)[0].shape == (1, 500)  # k beyond the corpus: all of it
    hits = next(ix.hits(*ix.search(q[:1], 2)))
    assert [list(h) for h in hits] == [["document", "score"]] * 2
    assert hits[0]["document"] == {"id": str(rows_n[0][0]), "contents": f"T{rows_n[0][0]}\nx"}


@pytest.mark.parametrize(("text", "msg"), [
    ('{"id": "a", "contents": "T\\nx"}\nnot json\n', "line 2: not a JSON object"),
    ('{"id": "a"}\n', "line 1: contents: must be a non-empty string"),
    ('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n', "line 2: id: duplicate id 'a'"),
    ('{"id": [1], "contents": "x"}\n', "line 1: id: must be a string or an integer"),
    ("\n", "holds no records"),
])
def test_corpus_errors_name_the_line_and_field(tmp_path: Path, text: str, msg: str) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(text)
    with pytest.raises(RetrievalIndexError) as got:
        read_corpus(f)
    assert msg in str(got.value)
