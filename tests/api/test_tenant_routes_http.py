"""Issue 41 items 1 and 2 through a real `tangram serve` (uvicorn, real sandboxes), two tenants.

- Every operation of `/openapi.json` (and the dashboard) is called as bob against alice's objects
  (a running action, a finished one, one with an idempotency key, a session holding a variable,
  an image whose OCI config carries a secret, a session in it): no answer carries a string of
  alice's that bob did not send himself, and afterwards each of her objects is as it was. An
  operation the table below does not probe fails the test, so a new route cannot be forgotten.
- A 2 s TTL frees the tenant's quota and the service's count within its period (429, then 201);
  an action naming the expired session answers that it expired.
- A `/run_code` or `/run_jupyter` whose client disconnects ends cancelled (`/run_code`: the fast
  path and the FastAPI route).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import tangram_serve

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
CAROL = "carol-token-0123456789abcdef"
OPER = "operator-token-0123456789abcdef"
SECRET = "ALICE_DB_PASSWORD=hunter2-" + uuid.uuid4().hex[:8]


dirs: dict[str, Path] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("tangram serve's sandboxes need root")
    d = tmp_path_factory.mktemp("tenant-routes")
    (d / "oper.tok").write_text(OPER + "\n")
    cfg = d / "service.yaml"
    cfg.write_text(
        f"auth: {{token_file: {d / 'oper.tok'}}}\n"
        "tenants:\n"
        f"  - {{name: alice, token: {ALICE}, max_sessions: 3}}\n"
        f"  - {{name: bob, token: {BOB}}}\n"
        f"  - {{name: carol, token: {CAROL}, max_sessions: 2}}\n"
        "nodes:\n"
        "  - name: local\n"
        "    gpu: false\n"
        f"    cpu: {{work_root: {d / 'w'}, warm_min: 1, warm_max: 4, "
        f"images_dir: {d / 'cache'}}}\n"
        f"images: {{import_dirs: [{d / 'imports'}]}}\n")
    from arl_tangram.managers.cpu.images import imagekit

    (d / "imports").mkdir()
    layer = imagekit.pack_layer(imagekit.host_rootfs(str(d / "rootfs")), str(d / "layer.tar"))
    imagekit.write_docker_archive(str(d / "imports/secret.tar"), [layer], config={
        "Env": ["PATH=/usr/bin:/bin", SECRET], "WorkingDir": "/"})
    with tangram_serve(cfg) as (url, _proc):
        dirs[url] = d
        yield url


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60)


# ---- item 1: every route, as bob, against alice's objects ---------------------------------------

Probe = tuple[str, str, dict[str, Any]]  # method, path, httpx keyword arguments


def _probes(o: dict[str, str]) -> dict[tuple[str, str], list[Probe]]:
    """For each operation of /openapi.json (method, path template): bob's requests naming
    alice's objects ``o``."""
    tool = {"kind": "tool", "session": o["session"], "payload": {"code": "print(secret)"}}
    return {
        ("GET", "/v1/ping"): [("GET", "/v1/ping", {})],
        ("GET", "/v1/health"): [("GET", "/v1/health", {})],
        ("POST", "/run_code"): [("POST", "/run_code", {"json": {"code": "print(1)"}})],
        ("POST", "/run_jupyter"): [("POST", "/run_jupyter", {"json": {"cells": ["1+1"]}})],
        ("POST", "/v1/actions"): [
            ("POST", "/v1/actions", {"json": {**tool, "wait": True}}),
            ("POST", "/v1/actions", {"json": {"kind": "tool", "session": o["img_session"],
                                              "payload": {"code": "env"}}}),
            ("POST", "/v1/actions", {"json": {"id": o["running"], "kind": "code",
                                              "payload": {"code": "print(1)"}}}),
            ("POST", "/v1/actions", {"json": {"id": o["done"], "kind": "code",
                                              "payload": {"code": "print(1)"}}}),
            ("POST", "/v1/actions", {"json": {"kind": "code", "wait": True, "payload": {
                "code": "env", "language": "bash", "image": "aimg"}}}),
            ("POST", "/v1/actions", {"json": {"kind": "code", "wait": True, "payload": {
                "code": "env", "language": "bash", "image": "alice+aimg"}}}),
            ("POST", "/v1/actions", {"headers": {"idempotency-key": o["key"]},
                                     "json": o["keyed_body"]}),
            ("POST", "/v1/actions", {"json": {**o["keyed_body"], "idempotency_key": o["key"]}}),
        ],
        ("GET", "/v1/actions/{action_id}"): [
            ("GET", f"/v1/actions/{a}", {"params": {"wait": 0.2}})
            for a in (o["running"], o["done"], o["keyed"])],
        ("DELETE", "/v1/actions/{action_id}"): [
            ("DELETE", f"/v1/actions/{a}", {}) for a in (o["running"], o["done"], o["keyed"])],
        ("POST", "/v1/sessions"): [
            ("POST", "/v1/sessions", {"json": {"session_id": o["session"]}}),
            ("POST", "/v1/sessions", {"json": {"image": "aimg"}}),
            ("POST", "/v1/sessions", {"json": {"image": "alice+aimg"}})],
        ("DELETE", "/v1/sessions/{session_id}"): [
            ("DELETE", f"/v1/sessions/{s}", {}) for s in (o["session"], o["img_session"])],
        ("GET", "/v1/images"): [("GET", "/v1/images", {})],
        ("DELETE", "/v1/images/{name}"): [
            ("DELETE", f"/v1/images/{n}", {}) for n in ("aimg", "alice+aimg")],
        # bob imports the same (shared) archive under alice's image name: his own image,
        # whose config he reads from the archive he named (so its secret is his to see)
        ("POST", "/v1/images"): [
            ("POST", "/v1/images", {"json": {"path": o["archive"], "name": "aimg"},
                                    "_own": [SECRET, "hunter2", "aimg"]})],
        ("PUT", "/v1/images/{name}"): [
            ("PUT", "/v1/images/alice+aimg", {"content": b"x" * 512})],
        ("GET", "/v1/cluster"): [("GET", "/v1/cluster", {})],
        ("GET", "/v1/stats"): [("GET", "/v1/stats", {})],
        ("GET", "/metrics"): [("GET", "/metrics", {})],
        ("POST", "/get_reward"): [("POST", "/get_reward", {"json": {"query": ["q"]}})],
        ("POST", "/classify"): [("POST", "/classify", {"json": {"input": "q"}})],
        ("POST", "/retrieve"): [("POST", "/retrieve", {"json": {"queries": ["q"]}})],
        ("POST", "/v1/search"): [("POST", "/v1/search", {"json": {"query": "q"}})],
        ("POST", "/v1/fetch"): [("POST", "/v1/fetch", {"json": {"url": "http://x/"}})],
        ("POST", "/v1/chat/completions"): [("POST", "/v1/chat/completions", {"json": {
            "model": "m", "messages": [{"role": "user", "content": "q"}]}})],
        ("POST", "/v1/completions"): [("POST", "/v1/completions", {"json": {
            "model": "m", "prompt": "q"}})],
    }


def _alice_objects(a: httpx.Client, archive: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    o: dict[str, Any] = {"running": f"alice-run-{tag}", "done": f"alice-done-{tag}",
                         "session": f"alice-sess-{tag}", "key": f"alice-key-{tag}",
                         "archive": archive, "out": f"alice-output-{tag}"}
    r = a.post("/v1/images", json={"path": archive, "name": "aimg"})
    assert r.status_code == 201, r.text
    assert SECRET in json.dumps(r.json()) or SECRET in json.dumps(a.get("/v1/images").json())
    r = a.post("/v1/actions", json={"id": o["running"], "kind": "code", "timeout_s": 120,
                                    "payload": {"code": "import time; time.sleep(90)",
                                                "run_timeout": 100}})
    assert r.status_code == 200, r.text
    r = a.post("/v1/actions", json={"id": o["done"], "kind": "code", "wait": True,
                                    "payload": {"code": f"print('{o['out']}')"}})
    assert r.json()["results"][0]["status"] == "succeeded", r.text
    o["keyed_body"] = {"kind": "code", "wait": True,
                       "payload": {"code": f"print('{o['out']}-k')"}}
    r = a.post("/v1/actions", headers={"idempotency-key": o["key"]}, json=o["keyed_body"])
    assert r.status_code == 200, r.text
    o["keyed"] = r.json()["ids"][0]
    assert a.post("/v1/sessions", json={"session_id": o["session"]}).status_code == 201
    r = a.post("/v1/actions", json={"kind": "tool", "session": o["session"], "wait": True,
                                    "payload": {"code": f"secret = '{o['out']}-s'"}})
    assert r.json()["results"][0]["status"] == "succeeded", r.text
    r = a.post("/v1/sessions", json={"image": "aimg"})
    assert r.status_code == 201, r.text
    o["img_session"] = r.json()["session_id"]
    r = a.post("/v1/actions", json={"kind": "tool", "session": o["img_session"], "wait": True,
                                    "payload": {"code": "echo up", "language": "bash"}})
    assert r.json()["results"][0]["status"] == "succeeded", r.text
    return o


def _marks(o: dict[str, Any]) -> list[str]:
    """Strings of alice's that bob must never read (unless his own request carried it)."""
    return [SECRET, "hunter2", "alice+", "aimg", o["out"], o["running"], o["done"],
            o["keyed"], o["session"], o["img_session"], o["key"]]


def test_no_route_shows_or_changes_another_tenants_objects(server: str) -> None:
    archive = str(dirs[server] / "imports/secret.tar")
    with _client(server, ALICE) as a, _client(server, BOB) as b:
        o = _alice_objects(a, archive)
        marks = _marks(o)
        ops = {(m.upper(), p) for p, item in b.get("/openapi.json").json()["paths"].items()
               for m in item if m in ("get", "post", "put", "delete", "patch")}
        table = _probes(o)
        assert sorted(ops - set(table)) == [], "operations no probe covers"
        last = ("POST", "/v1/images")  # (bob's own image of that name: after the others)
        calls = [c for op in sorted(ops, key=lambda op: (op == last, op)) for c in table[op]]
        calls.append(("GET", "/", {}))
        leaks: list[str] = []
        for method, path, kw in calls:
            own = kw.pop("_own", [])
            r = b.request(method, path, **kw)
            assert r.status_code != 500, (method, path, r.text)
            sent = path + json.dumps(kw, default=str) + json.dumps(own)
            for m in marks:
                if m not in sent and m in r.text:
                    leaks.append(f"{method} {path} -> {r.status_code} carries {m!r}")
            if path.startswith("/v1/actions/") and any(x in path for x in marks):
                assert r.status_code == 404, (method, path, r.text)
        assert leaks == []
        # nothing of alice's changed: her running action runs, her session keeps its
        # variable, her image and its config, her keyed and finished results are hers
        assert a.get(f"/v1/actions/{o['running']}").json()["status"] in ("running", "queued")
        r = a.post("/v1/actions", json={"kind": "tool", "session": o["session"], "wait": True,
                                        "payload": {"code": "print(secret)"}})
        assert f"{o['out']}-s" in json.dumps(r.json()["results"][0]["output"]), r.text
        r = a.post("/v1/actions", json={"kind": "tool", "session": o["img_session"],
                                        "wait": True, "payload": {"code": "echo still",
                                                                  "language": "bash"}})
        assert r.json()["results"][0]["status"] == "succeeded", r.text
        assert SECRET in a.get("/v1/images").text
        node = a.get("/v1/cluster").json()["nodes"][0]
        assert [i["name"] for i in node["images"]] == ["aimg"]
        assert SECRET in json.dumps(node["images"])
        assert a.get(f"/v1/actions/{o['done']}").json()["status"] == "succeeded"
        r = a.post("/v1/actions", headers={"idempotency-key": o["key"]}, json=o["keyed_body"])
        assert r.json()["ids"] == [o["keyed"]]
        # bob sees his own image and how many images others hold, not which
        bnode = b.get("/v1/cluster").json()["nodes"][0]
        assert [i["name"] for i in bnode["images"]] == ["aimg"]
        assert bnode["images_of_others"] == 1
        assert bnode["warm_of_others"] >= 1 and not any("alice" in k for k in bnode["warm"])
        assert b.delete("/v1/images/aimg").status_code == 200
        assert [i["name"] for i in a.get("/v1/images").json()["nodes"]["local"]] == ["aimg"]
        for cleanup in (a.delete(f"/v1/actions/{o['running']}"),
                        a.delete(f"/v1/sessions/{o['session']}"),
                        a.delete(f"/v1/sessions/{o['img_session']}")):
            assert cleanup.status_code == 200, cleanup.text


# ---- item 2: quotas that follow reality -----------------------------------------------------------

def _wait_for(pred: Callable[[], bool], what: str, bound_s: float) -> None:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {bound_s} s: {what}")


def test_a_2s_ttl_frees_the_quota_within_its_period(server: str) -> None:
    with _client(server, CAROL) as c, _client(server, OPER) as op:
        def count() -> int:
            return int(op.get("/v1/cluster").json()["sessions"])

        before = count()
        sids = []
        for _ in range(2):
            r = c.post("/v1/sessions", json={"ttl_s": 2})
            assert r.status_code == 201, r.text
            sids.append(r.json()["session_id"])
        r = c.post("/v1/actions", json={"kind": "tool", "session": sids[0], "wait": True,
                                        "payload": {"code": "x = 'kept'"}})
        assert r.json()["results"][0]["status"] == "succeeded", r.text
        assert count() == before + 2
        r = c.post("/v1/sessions", json={"ttl_s": 2})
        assert r.status_code == 429 and "max_sessions=2" in r.json()["detail"], r.text
        # the TTL's period: 2 s idle, then the core's next tick (0.5 s) and one more
        _wait_for(lambda: count() == before, "the expired sessions leave the count", 2 + 1.5)
        r = c.post("/v1/sessions", json={"ttl_s": 600})
        assert r.status_code == 201, r.text
        assert count() == before + 1
        r = c.post("/v1/actions", json={"kind": "tool", "session": sids[0], "wait": True,
                                        "payload": {"code": "print(x)"}})
        assert r.status_code == 400 and r.json()["field"] == "actions[0].session", r.text
        assert r.json()["detail"] == (
            f"actions[0].session: session {sids[0]!r} is not open: it expired (no action for "
            "its ttl_s); its state is gone (open a new session)")
        assert c.delete(f"/v1/sessions/{sids[1]}").status_code == 404
        assert count() == before + 1


def _stats(op: httpx.Client) -> dict[str, Any]:
    return dict(op.get("/v1/stats").json())


@pytest.mark.parametrize("path,content_type", [
    ("/run_code", "application/json"),  # the fast path
    ("/run_code", "application/vnd.tangram+json"),  # FastAPI's route
    ("/run_jupyter", "application/json")])
def test_a_disconnected_run_code_is_cancelled(server: str, path: str, content_type: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    with _client(server, OPER) as op:
        def cancelled() -> int:
            return int(_stats(op)["finished"].get("code", {}).get("cancelled", 0))

        def succeeded() -> int:
            return int(_stats(op)["finished"].get("code", {}).get("succeeded", 0))

        c0, s0 = cancelled(), succeeded()
        code = "import time; time.sleep(30)"
        body = json.dumps({"code": code, "run_timeout": 40} if path == "/run_code" else
                          {"cells": [code], "total_timeout": 40}).encode()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\n".encode()
                     + f"authorization: Bearer {BOB}\r\ncontent-type: {content_type}\r\n"
                       f"content-length: {len(body)}\r\n\r\n".encode() + body)
        _wait_for(lambda: _stats(op)["running"].get("code", 0) >= 1, "the action runs", 20)
        sock.close()
        _wait_for(lambda: cancelled() == c0 + 1, "the action ends cancelled", 20)
        assert succeeded() == s0
        assert _stats(op)["running"].get("code", 0) == 0
