"""Issue 25, item 3 (tenants) through a real `tangram serve` (uvicorn, real sandboxes): two named
tokens from the config file; one tenant's sessions and actions are unknown (404 / "not open") to
the other, idempotency keys are per tenant, and each tenant's caps (open sessions, concurrent
actions, on `/v1/actions` and on `/run_code`'s fast path) answer 429 naming the quota while the
other tenant is not held back."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _serve import tangram_serve

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
OPER = "operator-token-0123456789abcdef"


server_dir: dict[str, Path] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("tangram serve's sandboxes need root")
    d = tmp_path_factory.mktemp("tenants")
    (d / "alice.tok").write_text(ALICE + "\n")
    (d / "oper.tok").write_text(OPER + "\n")
    cfg = d / "service.yaml"
    cfg.write_text(
        f"auth: {{token_file: {d / 'oper.tok'}}}\n"
        "tenants:\n"
        f"  - {{name: alice, token_file: {d / 'alice.tok'}, max_sessions: 2,\n"
        "     max_concurrent_actions: 2}\n"
        f"  - {{name: bob, token: {BOB}}}\n"
        "nodes:\n"
        "  - name: local\n"
        "    gpu: false\n"
        f"    cpu: {{work_root: {d / 'w'}, warm_min: 1, warm_max: 4, "
        f"images_dir: {d / 'cache'}}}\n"
        f"images: {{import_dirs: [{d / 'imports'}]}}\n")
    from arl_tangram.managers.cpu.images import imagekit

    (d / "imports").mkdir()
    imagekit.pack_layer(imagekit.host_rootfs(str(d / "rootfs")), str(d / "imports/mini.tar.gz"),
                        gzip_it=True)
    with tangram_serve(cfg) as (url, _proc):
        server_dir[url] = d
        yield url


def _client(url: str, token: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=60)


def test_tokens_map_to_tenants(server: str) -> None:
    for tok in (None, "wrong-token-0123456789abcdef", ALICE[:-1], ALICE + "x"):
        with _client(server, tok) as c:
            assert c.post("/run_code", json={"code": "print(1)"}).status_code == 401
            assert c.get("/v1/actions/x").status_code == 401
    for tok in (ALICE, BOB, OPER):
        with _client(server, tok) as c:
            r = c.post("/run_code", json={"code": "print(6*7)"})
            assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "42\n", r.text


def test_one_tenants_sessions_and_actions_are_unknown_to_another(server: str) -> None:
    with _client(server, ALICE) as a, _client(server, BOB) as b, _client(server, OPER) as o:
        r = a.post("/v1/sessions", json={"session_id": "alice-s1"})
        assert r.status_code == 201, r.text
        r = a.post("/v1/actions", json={"kind": "tool", "session": "alice-s1", "wait": True,
                                        "payload": {"code": "secret = 'sesame'"}})
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "succeeded", r.text
        aid = r.json()["ids"][0]
        # bob (and the operator's token, a tenant like the others) cannot see or touch them
        for other in (b, o):
            assert other.get(f"/v1/actions/{aid}").status_code == 404
            assert other.delete(f"/v1/actions/{aid}").status_code == 404
            # the same answer as for an id never used
            assert (other.get(f"/v1/actions/{aid}").json()["detail"].replace(aid, "X")
                    == other.get("/v1/actions/never-used").json()["detail"].replace(
                        "never-used", "X"))
            r = other.post("/v1/actions", json={"kind": "tool", "session": "alice-s1",
                                                "wait": True,
                                                "payload": {"code": "print(secret)"}})
            assert r.status_code == 400 and "is not open" in r.json()["detail"], r.text
            assert other.delete("/v1/sessions/alice-s1").status_code == 404
        # alice still can
        assert a.get(f"/v1/actions/{aid}").status_code == 200
        r = a.post("/v1/actions", json={"kind": "tool", "session": "alice-s1", "wait": True,
                                        "payload": {"code": "print(secret)"}})
        assert r.status_code == 200, r.text
        assert "sesame" in str(r.json()["results"][0]["output"]), r.text
        assert a.delete("/v1/sessions/alice-s1").status_code == 200


def test_idempotency_keys_are_per_tenant(server: str) -> None:
    with _client(server, ALICE) as a, _client(server, BOB) as b:
        h = {"idempotency-key": "shared-key-1"}
        ra = a.post("/v1/actions", headers=h, json={"kind": "code", "wait": True,
                                                    "payload": {"code": "print('A')"}})
        rb = b.post("/v1/actions", headers=h, json={"kind": "code", "wait": True,
                                                    "payload": {"code": "print('B')"}})
        assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
        assert ra.json()["ids"] != rb.json()["ids"]
        assert "B" in str(rb.json()["results"][0]["output"]) and "A" not in str(
            rb.json()["results"][0]["output"].get("run_result", {}).get("stdout"))
        # within one tenant the key still dedupes
        again = b.post("/v1/actions", headers=h, json={"kind": "code", "wait": True,
                                                       "payload": {"code": "print('B')"}})
        assert again.json()["ids"] == rb.json()["ids"]


def test_caps_answer_429_for_one_tenant_only(server: str) -> None:
    with _client(server, ALICE) as a, _client(server, BOB) as b:
        sids = []
        for _ in range(2):
            r = a.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            sids.append(r.json()["session_id"])
        r = a.post("/v1/sessions", json={})
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert "alice" in r.json()["detail"] and "max_sessions=2" in r.json()["detail"]
        rb = b.post("/v1/sessions", json={})
        assert rb.status_code == 201, rb.text  # bob has no cap of his own
        assert b.delete(f"/v1/sessions/{rb.json()['session_id']}").status_code == 200
        assert a.delete(f"/v1/sessions/{sids[0]}").status_code == 200
        r = a.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        for sid in (sids[1], r.json()["session_id"]):
            assert a.delete(f"/v1/sessions/{sid}").status_code == 200

        # concurrent actions: two slow ones held, a third (native or /run_code) is refused
        slow = {"kind": "code", "payload": {"code": "import time; time.sleep(4)",
                                            "run_timeout": 20}}
        r = a.post("/v1/actions", json={"actions": [slow, slow], "wait": False})
        assert r.status_code == 200, r.text
        held = r.json()["ids"]
        r = a.post("/v1/actions", json={"kind": "code", "payload": {"code": "print(1)"}})
        assert r.status_code == 429 and "max_concurrent_actions=2" in r.json()["detail"], r.text
        r = a.post("/run_code", json={"code": "print(1)"})  # the fast path
        assert r.status_code == 429 and "max_concurrent_actions=2" in r.json()["detail"], r.text
        r = b.post("/run_code", json={"code": "print(2)"})
        assert r.status_code == 200 and r.json()["status"] == "Success", r.text
        for aid in held:
            r = a.get(f"/v1/actions/{aid}", params={"wait": 30})
            assert r.json()["finished"], r.text
        r = a.post("/run_code", json={"code": "print(3)"})
        assert r.status_code == 200 and r.json()["status"] == "Success", r.text


def test_a_tenants_images_are_its_own(server: str) -> None:
    tar = str(server_dir[server] / "imports/mini.tar.gz")
    with _client(server, ALICE) as a, _client(server, BOB) as b:
        r = a.post("/v1/images", json={"path": tar, "name": "mini"})
        assert r.status_code == 201 and r.json()["name"] == "mini", r.text
        assert [i["name"] for i in a.get("/v1/images").json()["nodes"]["local"]] == ["mini"]
        assert b.get("/v1/images").json()["nodes"]["local"] == []
        r = b.post("/v1/sessions", json={"image": "mini"})
        assert r.status_code == 400 and "no image 'mini'" in r.json()["detail"], r.text
        r = b.post("/v1/actions", json={"kind": "code", "wait": True, "payload": {
            "code": "cat /etc/os-release", "language": "bash", "image": "mini"}})
        assert "ID=tangram-mini" not in r.text
        assert b.delete("/v1/images/mini").status_code == 404
        # alice uses it, by her name for it
        r = a.post("/v1/actions", json={"kind": "code", "wait": True, "payload": {
            "code": "cat /etc/os-release", "language": "bash", "image": "mini"}})
        assert "ID=tangram-mini" in r.text, r.text
        r = a.post("/v1/sessions", json={"image": "mini"})
        assert r.status_code == 201, r.text
        assert a.delete(f"/v1/sessions/{r.json()['session_id']}").status_code == 200
        # bob may import his own "mini": another image, alice's untouched
        r = b.post("/v1/images", json={"path": tar, "name": "mini"})
        assert r.status_code == 201, r.text
        for _ in range(100):  # (the closed session lets go of the image in the background)
            r = a.delete("/v1/images/mini")
            if r.status_code != 409:
                break
            time.sleep(0.1)
        assert r.status_code == 200 and r.json()["name"] == "mini", r.text
        assert [i["name"] for i in b.get("/v1/images").json()["nodes"]["local"]] == ["mini"]
        assert b.delete("/v1/images/mini").status_code == 200
