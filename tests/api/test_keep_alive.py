"""HTTP keep-alive (issue 16, item 4): `tangram serve` keeps an idle connection open longer than
common clients' idle pools (default 75 s, `server.keep_alive_s` / `--keep-alive-s`), so a client
that reuses its pooled connection after 5+ s idle (uvicorn's own default) is answered on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from arl_tangram.runtime.config import DEFAULT_KEEP_ALIVE_S, parse_service_config

PING = b"GET /v1/ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _serve(*args: str) -> Iterator[int]:
    port = _free_port()
    tangram = os.path.join(os.path.dirname(sys.executable), "tangram")
    proc = subprocess.Popen([tangram, "serve", "--no-models", "--port", str(port),
                             "--log-level", "warning", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(f"tangram serve exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/ping", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _response(sock: socket.socket) -> bytes:
    """One whole response to PING (headers and the small body), or b"" on EOF."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return buf
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    n = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:"))
    while len(body) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.needs_root
def test_idle_connection_is_reused_past_the_old_5s_timeout() -> None:
    if os.geteuid() != 0:
        pytest.skip("tangram serve's sandboxes need root")
    with _serve() as default_port, _serve("--keep-alive-s", "1") as short_port:
        conns = {}
        for name, port in (("default", default_port), ("short", short_port)):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(PING)
            assert _response(s).startswith(b"HTTP/1.1 200"), name
            conns[name] = s
        time.sleep(6.0)  # idle, longer than uvicorn's default keep-alive timeout (5 s)
        # the same socket, i.e. the same TCP connection: answered on it
        s = conns["default"]
        s.sendall(PING)
        again = _response(s)
        assert again.startswith(b"HTTP/1.1 200") and b"pong" in again, again
        # and the setting is what decides: with 1 s, the server has closed the idle connection
        s = conns["short"]
        try:
            s.sendall(PING)
            closed = _response(s) == b""
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed
        for s in conns.values():
            s.close()


def test_keep_alive_is_configurable_and_validated() -> None:
    assert DEFAULT_KEEP_ALIVE_S > 15  # aiohttp's idle pool (httpx: 5 s, urllib3: no limit)
    assert parse_service_config({}).keep_alive_s == DEFAULT_KEEP_ALIVE_S
    assert parse_service_config({"server": {"keep_alive_s": 120}}).keep_alive_s == 120.0
    with pytest.raises(Exception, match="keep_alive_s"):
        parse_service_config({"server": {"keep_alive_s": 0}})
