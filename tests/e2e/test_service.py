"""End to end over real HTTP: real sandboxes, real models, every compat route, the SDK."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import httpx
import pytest

from arl_tangram import AsyncClient, Client

pytestmark = pytest.mark.integration

SF_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}


def post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def test_sandboxfusion_run_code(server: str) -> None:
    assert httpx.get(server + "/v1/ping").json() == "pong"
    r = post(server, "/run_code", {"code": "import sys\nprint(sys.stdin.read().upper())",
                                   "stdin": "abc"})  # no language: python
    assert r.status_code == 200
    body = r.json()
    assert body.keys() >= SF_KEYS
    assert body["status"] == "Success" and body["run_result"]["status"] == "Finished"
    assert body["run_result"]["stdout"] == "ABC\n" and body["run_result"]["stderr"] == ""
    assert isinstance(body["files"], dict) and body["executor_pod_name"]
    bad = post(server, "/run_code", {"code": "raise SystemExit(3)", "language": "python"}).json()
    assert bad["status"] == "Failed" and bad["run_result"]["return_code"] == 3
    slow = post(server, "/run_code", {"code": "while True: pass", "run_timeout": 0.5}).json()
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    hog = post(server, "/run_code", {"code": "x = bytearray(300 * 2**20)\nprint(len(x))",
                                     "memory_limit_MB": 64}).json()
    assert hog["status"] == "Failed" and "314572800" not in hog["run_result"]["stdout"]
    sh = post(server, "/run_code", {"code": "echo $((6*7))", "language": "bash"}).json()
    assert sh["run_result"]["stdout"] == "42\n"


def test_native_actions_tests_and_sessions(server: str) -> None:
    code = "def add(a, b):\n    return a + b\n"
    r = post(server, "/v1/actions", {"kind": "test", "wait": True, "payload": {
        "code": code, "language": "python",
        "cases": [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(1, 2) == 4"}]}})
    res = r.json()["results"][0]
    assert res["status"] == "failed" and [c["passed"] for c in res["output"]["cases"]] == [True, False]
    sid = post(server, "/v1/sessions", {"ttl_s": 60}).json()["session_id"]
    first = post(server, "/v1/actions", {"kind": "tool", "session": sid, "wait": True,
                                         "payload": {"code": "x = 41", "language": "python"}})
    assert first.json()["results"][0]["status"] == "succeeded", first.text
    second = post(server, "/v1/actions", {"kind": "tool", "session": sid, "wait": True,
                                          "payload": {"code": "print(x + 1)", "language": "python"}})
    assert second.json()["results"][0]["output"]["run_result"]["stdout"].strip() == "42"
    assert httpx.delete(f"{server}/v1/sessions/{sid}").status_code == 200
    slow = post(server, "/v1/actions", {"kind": "code", "payload": {"code": "import time; time.sleep(30)"}})
    aid = slow.json()["ids"][0]
    assert httpx.delete(f"{server}/v1/actions/{aid}").json()["cancelled"] is True
    got = httpx.get(f"{server}/v1/actions/{aid}", params={"wait": 10}, timeout=20).json()
    assert got["status"] == "cancelled"


def test_reward_routes(server: str) -> None:
    r = post(server, "/get_reward", {"query": ["2 + 2 = 4", "the sky is green"]})
    assert r.status_code == 200, r.text
    rewards = r.json()["rewards"]
    assert len(rewards) == 2 and all(isinstance(x, float) for x in rewards)
    sim = post(server, "/get_reward", {"query": ["hello world", "hello world"], "model": "minilm",
                                       "labels": ["hello world", "tax law of 1923"]}).json()
    assert sim["rewards"][0] > sim["rewards"][1]
    both = post(server, "/get_reward", {"query": ["a b c"], "labels": ["a b c"],
                                        "model": ["tiny-rm", "minilm"]}).json()
    assert set(both["scores_by_model"]) == {"tiny-rm", "minilm"}
    cl = post(server, "/classify", {"model": "tiny-safety", "input": ["ok", "not ok"]}).json()
    assert [d["index"] for d in cl["data"]] == [0, 1]
    assert all(len(d["probs"]) == 2 and abs(sum(d["probs"]) - 1) < 1e-4 for d in cl["data"])
    multi = post(server, "/v1/actions", {"kind": "reward", "models": ["tiny-rm", "minilm"],
                                         "payload": {"query": "x", "reference": "x"}, "wait": True})
    out = multi.json()["results"][0]
    assert out["status"] == "succeeded" and set(out["output"]["scores"]) == {"tiny-rm", "minilm"}


def test_sdk_over_http(server: str) -> None:
    with Client(server) as c:
        assert c.ping()
        out = c.run_code("print(6 * 7)")
        assert out["run_result"]["stdout"] == "42\n"
        with c.session() as s:
            s.run("import os; os.environ['T'] = 'kept'")
            assert s.run("import os; print(os.environ['T'])")["run_result"]["stdout"] == "kept\n"
        a = c.submit({"kind": "code", "payload": {"code": "print(1)"}}, idempotency_key="once")
        b = c.submit({"kind": "code", "payload": {"code": "print(1)"}}, idempotency_key="once")
        assert a["ids"] == b["ids"]
        assert c.result(a["ids"][0])["status"] == "succeeded"
        assert isinstance(c.reward("a fine answer", model="tiny-rm"), float)
        assert set(c.reward("x", reference="x", model=["tiny-rm", "minilm"])) == {"tiny-rm", "minilm"}
    metrics = httpx.get(server + "/metrics").text
    assert 'tangram_actions_finished_total{kind="code",status="succeeded"}' in metrics
    assert "tangram_model_loads_total" in metrics


async def test_async_sdk_embedded_without_models() -> None:
    from arl_tangram.runtime.config import default_config

    async with await AsyncClient.embedded(default_config(with_models=False)) as c:
        out = await c.run_tests("def f():\n    return 1\n", [{"assert": "assert f() == 1"}])
        assert out["status"] == "Success"
        stats = await c.stats()
        assert stats["finished"]["test"]["succeeded"] == 1


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (scripts/system-deps.sh)")
def test_dashboard_in_headless_chromium(server: str) -> None:
    post(server, "/run_code", {"code": "print(1)"})  # something to show
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=8000",
             "--dump-dom", server + "/"],
            capture_output=True, text=True, timeout=90).stdout
    assert 'id="policy">tangram<' in dom, dom[:2000]
    assert 'id="updated">never<' not in dom
    assert "<td>code</td>" in dom  # the queue table lists the code actions
    assert "<td>local</td>" in dom  # utilization rows per node
