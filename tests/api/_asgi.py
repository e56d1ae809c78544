"""An ASGI request whose client goes away: the body once, then (50 ms later) a disconnect, as
uvicorn reports a closed connection. One copy of what the client-gone tests share."""

from __future__ import annotations

import asyncio
from typing import Any


async def client_gone(
    app: Any, path: str, body: bytes, *, timeout: float = 10
) -> list[dict[str, Any]]:
    """What ``app`` sent for a JSON POST to ``path`` whose client left after sending ``body``."""
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if msgs:
            return msgs.pop(0)
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("t", 80),
        "client": ("127.0.0.1", 1),
        "headers": [(b"content-type", b"application/json"), (b"host", b"t")],
    }
    await asyncio.wait_for(app(scope, receive, send), timeout)
    return sent
