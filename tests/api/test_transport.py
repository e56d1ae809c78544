"""The coalescing transport: a response's head and body leave in one write, bytes in order,
nothing held past the loop iteration or a close; and uvicorn serves real HTTP through it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from arl_tangram.api.transport import CoalescingTransport, http_protocol


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("peer", name)


async def test_joins_head_and_body_and_flushes_lone_writes() -> None:
    t = Recorder()
    c = CoalescingTransport(t, asyncio.get_running_loop())
    c.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert t.writes == [] and c.get_write_buffer_size() == 19
    c.write(memoryview(b"body"))
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]  # one write, in order
    c.write(b"chunk")
    await asyncio.sleep(0)  # the end of the iteration flushes a lone write
    assert t.writes[-1] == b"chunk"
    c.writelines([b"a", b"b"])
    c.write_eof()  # flushes first
    assert t.writes[-1] == b"ab" and t.eof
    c.write(b"last")
    c.close()
    assert t.writes[-1] == b"last" and t.closed
    assert c.get_extra_info("socket") == ("peer", "socket")  # the rest is the real transport's
    c.write(b"after close")
    await asyncio.sleep(0)
    assert t.writes[-1] == b"last"  # a closing connection gets nothing more


@pytest.mark.integration
def test_uvicorn_serves_through_it() -> None:
    import uvicorn

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/stream":  # chunked: several body messages
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"a" * 70000, b"b", b""):
                await send({"type": "http.response.body", "body": part, "more_body": part != b""})
            return
        out = b"echo:" + body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        http=http_protocol(), lifespan="off"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 10
        while not srv.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:  # keep-alive: one conn
            for i in range(5):
                r = c.post("/x", content=f"n{i}".encode())
                assert r.status_code == 200 and r.content == f"echo:n{i}".encode()
            r = c.get("/stream")
            assert r.content == b"a" * 70000 + b"b"
            r = c.post("/x", content=b"bye", headers={"connection": "close"})
            assert r.content == b"echo:bye"
    finally:
        srv.should_exit = True
        th.join(10)
