"""The edge refuses what the core cannot hold or what could name another path (issue 35, H2,
L2, L3), through a real `tangram serve` (uvicorn on loopback, real sandboxes): every numeric
field bounded (422 naming the field), session ids and file names that could name another path
refused, an image name ending in a newline refused, and no host path of an image's source shown
by `/v1/images` or `/v1/cluster`. Before the fix `hints.tokens = 10**400` was accepted (200) and
left its action queued for ever."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import tangram_serve

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]


class Server:
    def __init__(self, url: str, d: Path, image_path: str) -> None:
        self.url, self.dir, self.image_path = url, d, image_path

    def post(self, path: str, body: Any) -> httpx.Response:
        raw = body if isinstance(body, str) else json.dumps(body)
        return httpx.post(self.url + path, content=raw, timeout=30,
                          headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if os.geteuid() != 0:
        pytest.fail("tangram serve's sandboxes need root")
    d = tmp_path_factory.mktemp("edge")
    from arl_tangram.managers.cpu.images import imagekit

    (d / "shared").mkdir()
    image_path = str(d / "shared/mini-secret-host-dir.tar.gz")
    imagekit.pack_layer(imagekit.host_rootfs(str(d / "rootfs")), image_path, gzip_it=True)
    (d / "spool").mkdir()
    cfg = d / "service.yaml"
    cfg.write_text(
        "nodes:\n"
        "  - name: local\n"
        "    gpu: false\n"
        f"    cpu: {{work_root: {d / 'w'}, warm_min: 1, warm_max: 2, "
        f"images_dir: {d / 'cache'}}}\n"
        f"images: {{load: [{{name: mini, path: {image_path}}}], upload_dir: {d / 'spool'}}}\n")
    with tangram_serve(cfg) as (url, _proc):
        yield Server(url, d, image_path)


def _fields(r: httpx.Response) -> list[str]:
    """The fields a 422 names (pydantic's locations without "body")."""
    return [".".join(str(p) for p in e["loc"] if p != "body") for e in r.json()["detail"]]


HUGE = "1" + "0" * 400  # 10**400 as JSON: valid, and no float holds it


def test_a_hint_too_large_for_a_float_is_refused_naming_the_field(server: Server) -> None:
    r = server.post("/v1/actions", '{"kind": "code", "payload": {"code": "print(1)"}, '
                    '"hints": {"tokens": ' + HUGE + "}}")
    assert r.status_code == 422, r.text
    assert _fields(r) == ["hints.tokens"]
    assert r.json()["message"].startswith("hints.tokens: Input should be less than or equal")
    # and nothing was left pending: the service's stats count no queued action
    st = httpx.get(server.url + "/v1/stats", timeout=10).json()
    assert st["queue_length"] == 0 and st["submitted"] == {}


@pytest.mark.parametrize(("body", "field"), [
    ({"hints": {"test_count": 10**7}}, "hints.test_count"),
    ({"hints": {"items": 10**7}}, "hints.items"),
    ({"hints": {"expected_s": 1e300}}, "hints.expected_s"),
    ({"weight": 1e300}, "weight"),
    ({"timeout_s": 3601}, "timeout_s"),
    ({"demand": {"cpu": 1e300}}, "demand.cpu"),
    ({"elasticity": {"min": 1, "max": 1e300}}, "elasticity.max"),
    ({"elasticity": {"min": 1e-300, "max": 2}}, None),  # tiny but > 0: fine (no 422)
])
def test_native_numbers_are_bounded(server: Server, body: dict[str, Any],
                                    field: str | None) -> None:
    r = server.post("/v1/actions", {"kind": "code", "payload": {"code": "print(1)"}, **body})
    if field is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 422, r.text
    assert _fields(r) == [field]


def test_nan_and_infinity_are_refused(server: Server) -> None:
    r = server.post("/v1/actions", '{"kind": "code", "payload": {}, "weight": NaN}')
    assert r.status_code == 422 and _fields(r) == ["weight"]
    r = server.post("/v1/actions", '{"kind": "code", "payload": {}, "demand": {"cpu": Infinity}}')
    assert r.status_code == 422 and _fields(r) == ["demand.cpu"]


def test_wait_numbers_are_bounded(server: Server) -> None:
    r = server.post("/v1/actions", {"actions": [{"kind": "code", "payload": {}}],
                                    "wait_s": 1e300})
    assert r.status_code == 422 and _fields(r) == ["wait_s"]
    r = httpx.get(server.url + "/v1/actions/nope", params={"wait": "1e300"}, timeout=10)
    assert r.status_code == 422 and _fields(r) == ["query.wait"]


def test_run_code_memory_is_bounded(server: Server) -> None:
    r = server.post("/run_code", {"code": "print(1)", "memory_limit_MB": 2**40})
    assert r.status_code == 422 and _fields(r) == ["memory_limit_MB"]


@pytest.mark.parametrize("layer_mb", [1, 3])
def test_a_layer_below_the_minimum_is_refused_at_open(server: Server, layer_mb: int) -> None:
    r = server.post("/v1/sessions", {"image": "mini", "layer_mb": layer_mb})
    assert r.status_code == 422, r.text
    assert _fields(r) == ["layer_mb"]
    assert "greater than or equal to 4" in r.json()["message"]


@pytest.mark.parametrize("sid", ["\u0000", "../../x", "a/b", "..", "x\n", "tab\there", "\x7f"])
def test_a_session_id_that_could_name_a_path_is_refused(server: Server, sid: str) -> None:
    r = server.post("/v1/sessions", {"session_id": sid})
    assert r.status_code == 422, r.text
    assert _fields(r) == ["session_id"]
    r = server.post("/v1/actions", {"kind": "tool", "session": sid, "payload": {}})
    assert r.status_code == 422 and _fields(r) == ["session"]


def test_closing_a_session_id_that_could_name_a_path_is_refused(server: Server) -> None:
    for quoted in ("a%00b", "..x", "a%1Bb"):  # ('/' itself never reaches the route: 404)
        r = httpx.delete(server.url + "/v1/sessions/" + quoted, timeout=10)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == "session_id"


@pytest.mark.parametrize(("files", "why"), [
    ({"a\u0000b": ""}, "must not contain NUL"),
    ({"x" * 5000: ""}, "at most 4096 bytes, got 5000"),
    ({"d/" + "y" * 256: ""}, "at most 255 bytes, got one of 256"),
])
def test_file_names_a_sandbox_cannot_make_are_refused(server: Server, files: dict[str, str],
                                                      why: str) -> None:
    r = server.post("/run_code", {"code": "print(1)", "files": files})
    assert r.status_code == 422, r.text
    assert _fields(r)[0].startswith("files.")
    assert why in r.json()["message"]
    r = server.post("/run_code", {"code": "print(1)", "fetch_files": list(files)})
    assert r.status_code == 422 and _fields(r) == ["fetch_files.0"]
    r = server.post("/v1/actions", {"kind": "code", "payload": {"code": "print(1)",
                                                                "files": files}})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "actions[0].payload.files" and why in r.json()["detail"]


def test_a_file_name_of_255_bytes_still_runs(server: Server) -> None:
    """The bound is the kernel's, not below it."""
    name = "f" * 255
    r = server.post("/run_code", {"code": f"print(open({name!r}).read())",
                                  "files": {name: "aGk="}})
    assert r.status_code == 200, r.text
    assert r.json()["run_result"]["stdout"] == "hi\n"


def test_an_image_name_ending_in_a_newline_is_refused(server: Server) -> None:
    r = httpx.put(server.url + "/v1/images/x%0A", content=b"not read", timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "name"
    listing = httpx.get(server.url + "/v1/images", timeout=10).json()
    assert [i["name"] for i in listing["nodes"]["local"]] == ["mini"]


def test_no_host_path_of_an_image_source_is_shown(server: Server) -> None:
    listing = httpx.get(server.url + "/v1/images", timeout=10)
    assert listing.status_code == 200
    assert [(i["name"], i["source"]) for i in listing.json()["nodes"]["local"]] == [
        ("mini", "config")]
    cluster = httpx.get(server.url + "/v1/cluster", timeout=10)
    (node,) = cluster.json()["nodes"]
    assert node["image_sources"] == {"mini": "config"}
    for body in (listing.text, cluster.text):
        assert "mini-secret-host-dir" not in body and str(server.dir) not in body
