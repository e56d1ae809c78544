"""Slow clients (issue 35, M4) against a real `tangram serve` (uvicorn on loopback, real
sandboxes) whose process may hold 1,024 files, the common limit: 2,000 connections from one
client that never finish their headers cannot stop another client's `/run_code`; a connection
that does not finish its headers, and an upload whose body stalls, are closed past their
deadlines (`limits.header_timeout_s`, `limits.body_timeout_s`) and the upload's spool removed.
Before the fix (uvicorn alone) the half-open connections took every fd of the server and the
others were held for ever."""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _serve import tangram_serve

pytestmark = [pytest.mark.integration, pytest.mark.needs_root]

PER_IP = 64  # limits.max_connections_per_ip of the first server
HALF_OPEN = 2000


def _fd_limit_1024() -> None:  # (in the server's child process, before exec)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


@contextlib.contextmanager
def _serve(d: Path, limits: str) -> Iterator[str]:
    cfg = d / "service.yaml"
    cfg.write_text(
        f"limits: {{{limits}}}\n"
        "nodes:\n"
        "  - name: local\n"
        "    gpu: false\n"
        f"    cpu: {{work_root: {d / 'w'}, warm_min: 1, warm_max: 2, "
        f"images_dir: {d / 'cache'}}}\n"
        f"images: {{upload_dir: {d / 'spool'}}}\n")
    (d / "spool").mkdir()
    with tangram_serve(cfg, preexec_fn=_fd_limit_1024) as (url, _proc):
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _still_open(socks: dict[int, socket.socket], rounds: int = 1) -> int:
    """Drop from ``socks`` those the server has closed (readable: EOF or a reset); how many
    are left."""
    p = select.poll()
    for fd in socks:
        p.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    for fd, _ev in p.poll(0):
        s = socks.pop(fd)
        with contextlib.suppress(OSError):
            s.recv(1)
        s.close()
    return len(socks)


def _run_code_ok(url: str) -> None:
    r = httpx.post(url + "/run_code", json={"code": "print(6 * 7)"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "Success" and r.json()["run_result"]["stdout"] == "42\n"


@pytest.fixture(scope="module", autouse=True)
def _client_fds() -> Iterator[None]:
    """This process opens 2,000 sockets: its own soft fd limit raised to fit (restored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = HALF_OPEN + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.fail(f"the test needs {need} fds, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_half_open_connections_cannot_starve_another_client(tmp_path: Path) -> None:
    # (header_timeout_s long: what keeps the server serving here is the cap, not the deadline)
    with _serve(tmp_path, f"header_timeout_s: 600, max_connections_per_ip: {PER_IP}, "
                          "max_pending_connections: 256") as url:
        socks: dict[int, socket.socket] = {}
        try:
            for i in range(HALF_OPEN):
                s = socket.socket()
                s.setblocking(True)
                s.settimeout(10)
                s.connect(("127.0.0.1", _port(url)))
                if i % 2:  # half of them begin a request and never end its headers
                    s.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n")
                socks[s.fileno()] = s
            _run_code_ok(url)  # another client is served, on a fresh connection
            # the server keeps the newest PER_IP of them (once they have waited a second) and
            # has closed the others
            for _ in range(3000):
                if _still_open(socks) <= PER_IP:
                    break
                time.sleep(0.01)
            assert len(socks) == PER_IP
            # a client's connection, the 65th before its headers, pushes out the oldest one
            r = httpx.get(url + "/v1/ping", timeout=30)
            assert (r.status_code, r.json()) == (200, "pong")
            for _ in range(3000):
                if _still_open(socks) <= PER_IP - 1:
                    break
                time.sleep(0.01)
            assert len(socks) == PER_IP - 1
        finally:
            for s in socks.values():
                s.close()


def test_headers_and_bodies_past_their_deadlines_are_dropped(tmp_path: Path) -> None:
    with _serve(tmp_path, "header_timeout_s: 1, body_timeout_s: 1") as url:
        spool = tmp_path / "spool"
        # a connection that never finishes its headers is closed by the server
        slow = socket.create_connection(("127.0.0.1", _port(url)), timeout=60)
        slow.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n")
        assert slow.recv(1024) == b""  # EOF, not a response (and not our 60 s timeout)
        slow.close()
        # an upload that stalls after 1,000 bytes of a declared 10 MB: dropped, spool removed
        up = socket.create_connection(("127.0.0.1", _port(url)), timeout=60)
        up.sendall(b"PUT /v1/images/stalled HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\n"
                   + b"\0" * 1000)
        seen = False
        for _ in range(500):  # the spool appears while the body streams
            if any(spool.iterdir()):
                seen = True
                break
            time.sleep(0.01)
        assert seen, "the upload was never spooled"
        assert up.recv(1024) == b""
        up.close()
        for _ in range(1000):
            if not any(spool.iterdir()):
                break
            time.sleep(0.01)
        assert list(spool.iterdir()) == []
        assert httpx.get(url + "/v1/images", timeout=10).json()["nodes"]["local"] == []
        # a client that sends at once is served (its keep-alive connection too, twice)
        with httpx.Client(base_url=url, timeout=60) as c:
            for _ in range(2):
                assert c.get("/v1/ping").json() == "pong"
        _run_code_ok(url)


async def test_a_stalled_upload_is_dropped_by_the_route_itself(tmp_path: Path) -> None:
    """Under any ASGI server (here none: the embedded client's in-process transport, no
    uvicorn guard), `PUT /v1/images/{name}` drops a body that stalls for twice
    `limits.body_timeout_s`: 408, its spool removed."""
    import asyncio

    from arl_tangram.client import AsyncClient
    from arl_tangram.runtime.config import parse_service_config

    (tmp_path / "spool").mkdir()
    cfg = parse_service_config({
        "images": {"upload_dir": str(tmp_path / "spool")},
        "limits": {"body_timeout_s": 0.5},
        "nodes": [{"name": "local", "gpu": None,
                   "cpu": {"work_root": str(tmp_path / "w"), "warm_min": 1}}]})
    never = asyncio.Event()
    spooled = asyncio.Event()

    async def stalls():  # type: ignore[no-untyped-def]
        yield b"\0" * 1000
        spooled.set()
        await never.wait()  # (never set: the client sends nothing more)
        yield b""

    async with await AsyncClient.embedded(cfg) as c:
        http: httpx.AsyncClient = c._http
        put = asyncio.ensure_future(http.put("/v1/images/stalled", content=stalls()))
        await asyncio.wait_for(spooled.wait(), 30)
        r = await asyncio.wait_for(put, 30)  # (bounded: before the fix it never answers)
        assert r.status_code == 408, r.text
        assert r.json()["detail"] == "body: no byte for 1 s; upload dropped"
        assert os.listdir(tmp_path / "spool") == []
        assert (await c.images())["nodes"]["local"] == []
