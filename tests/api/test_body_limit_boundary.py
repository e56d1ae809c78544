"""The request body limit at its boundary (issue 27, audit A2): a body of exactly
``max_body_bytes`` is served, one byte more is answered 413, whether its length is declared
(Content-Length) or streamed (chunked: several ASGI body messages, no length), on the
middleware alone and through the whole app (both /run_code paths)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fakes import FakeExecutor, core_factory

from arl_tangram.api.app import create_app
from arl_tangram.api.middleware import BodyTooLarge, GuardMiddleware
from arl_tangram.runtime.config import LimitsConfig, ServiceConfig
from arl_tangram.runtime.engine import Engine, EngineConfig

LIMIT = 4096


async def _through_middleware(body: bytes, *, chunk: int | None) -> tuple[int | None, bytes]:
    """Send ``body`` through GuardMiddleware to an app that reads it all; (status, what the app
    read). ``chunk``: None declares the length and sends one message; else chunked, no length."""
    got = bytearray()
    status: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            while True:
                msg = await receive()
                got.extend(msg.get("body", b""))
                if not msg.get("more_body"):
                    break
        except BodyTooLarge:
            await send({"type": "http.response.start", "status": 413, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    if chunk is None:
        msgs = [{"type": "http.request", "body": body, "more_body": False}]
        headers = [(b"content-length", str(len(body)).encode())]
    else:
        parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
        msgs = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]
        headers = [(b"transfer-encoding", b"chunked")]

    async def receive() -> dict[str, Any]:
        return msgs.pop(0)

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            status.append(msg["status"])

    mw = GuardMiddleware(app, token=None, max_body_bytes=LIMIT)
    await mw({"type": "http", "path": "/run_code", "method": "POST", "headers": headers},
             receive, send)
    return (status[0] if status else None), bytes(got)


@pytest.mark.parametrize("chunk", [None, 1000, 4095, 4096, 1], ids=lambda c: f"chunk={c}")
async def test_middleware_serves_the_limit_and_refuses_one_byte_more(chunk: int | None) -> None:
    body = bytes(range(256)) * (LIMIT // 256)
    assert len(body) == LIMIT
    assert await _through_middleware(body, chunk=chunk) == (200, body)
    status, _ = await _through_middleware(body + b"!", chunk=chunk)
    assert status == 413


def _body(n: int) -> bytes:
    head, tail = b'{"code": "', b'"}'
    b = head + b"x" * (n - len(head) - len(tail)) + tail
    assert len(b) == n
    return b


async def _post(fast: bool, body: bytes, *, chunked: bool) -> httpx.Response:
    cfg = ServiceConfig(limits=LimitsConfig(max_body_bytes=LIMIT))
    eng = Engine(FakeExecutor(cpu=4), EngineConfig(tick_s=0.05), core_factory=core_factory)
    app = create_app(eng, cfg, fast_paths=fast)
    await eng.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
                                     base_url="http://t", timeout=60) as c:
            if not chunked:
                return await c.post("/run_code", content=body,
                                    headers={"content-type": "application/json"})

            async def parts() -> AsyncIterator[bytes]:
                for i in range(0, len(body), 1000):
                    yield body[i:i + 1000]

            return await c.post("/run_code", content=parts(),
                                headers={"content-type": "application/json"})
    finally:
        await eng.aclose()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("fast", [False, True], ids=["route", "fast-path"])
async def test_app_serves_the_limit_and_refuses_one_byte_more(fast: bool, chunked: bool) -> None:
    r = await _post(fast, _body(LIMIT), chunked=chunked)
    assert r.status_code == 200, r.text
    r = await _post(fast, _body(LIMIT + 1), chunked=chunked)
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == f"body: larger than {LIMIT} bytes"


async def test_the_middlewares_answers_are_complete_json() -> None:
    """413 and 401 answered by the middleware itself: a JSON body with its type and exact length
    (a client reading by content-length must get all of it), and the auth challenge on 401."""
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("the route must not be reached")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    for token, headers, status, detail in (
            (None, [(b"content-length", str(LIMIT + 1).encode())], 413,
             f"body: larger than {LIMIT} bytes"),
            (None, [(b"content-length", b"12x")], 400, "content-length: not an integer"),
            ("s3cret", [(b"authorization", b"Bearer wrong")], 401,
             "missing or bad bearer token (Authorization)"),
            ("s3cret", [], 401, "missing or bad bearer token (Authorization)")):
        sent.clear()
        mw = GuardMiddleware(app, token=token, max_body_bytes=LIMIT)
        await mw({"type": "http", "path": "/run_code", "method": "POST", "headers": headers},
                 receive, send)
        start, body = sent
        assert start["type"] == "http.response.start" and start["status"] == status
        h = dict(start["headers"])
        assert h[b"content-type"] == b"application/json"
        assert h[b"content-length"] == str(len(body["body"])).encode()
        assert json.loads(body["body"]) == {"detail": detail}
        assert (h.get(b"www-authenticate") == b"Bearer") is (status == 401)


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_other_scopes_pass_through_untouched(kind: str) -> None:
    """Only HTTP requests are checked: another scope reaches the app with the very same scope,
    receive and send, even with a token set and no credentials."""
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    async def receive() -> dict[str, Any]:
        return {"type": f"{kind}.connect"}

    async def send(msg: dict[str, Any]) -> None:
        raise AssertionError(f"the middleware answered a {kind} scope: {msg}")

    scope = {"type": kind, "path": "/v1/actions", "headers": []}
    await GuardMiddleware(app, token="s3cret", max_body_bytes=1)(scope, receive, send)
    assert len(seen) == 1
    assert seen[0][0] is scope and seen[0][1] is receive and seen[0][2] is send
