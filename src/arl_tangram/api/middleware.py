"""ASGI middleware: bearer-token auth and request body size limit (pure ASGI, no buffering).

Invariant: a request either passes both checks untouched or is answered here with 401 / 413 and
never reaches a route. A request that passes carries its tenant's name in the ASGI scope
(`TENANT_KEY`; absent when no token is configured): the tenant whose token it presented, found by
comparing it with every tenant's token in constant time (no early exit, so the time taken tells
nothing of which token or how much of one matched).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import TangramError
from ..runtime.config import DEFAULT_TENANT

Scope = dict[str, Any]
TENANT_KEY = "tangram.tenant"  # scope key: the name of the request's tenant
OPEN_PATHS = frozenset({"/", "/v1/ping", "/v1/health", "/favicon.ico"})  # no data behind them


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _send_json(send: Any, status: int, body: dict[str, Any],
                     extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class GuardMiddleware:
    """Rejects requests without the bearer token (when one is set) or with oversized bodies."""

    def __init__(self, app: Any, *, token: str | None = None, max_body_bytes: int,
                 tenants: Mapping[str, str] | None = None,
                 uploads: Sequence[tuple[str, str, int]] = ()) -> None:
        """``tenants``: token -> tenant name; ``token`` alone is tenant ``default``.
        ``uploads``: ``(method, path prefix, limit)`` of the routes whose bodies are files
        (image archives) with a limit of their own instead of ``max_body_bytes``."""
        self.app, self.max_body = app, max_body_bytes
        self.uploads = tuple(uploads)
        toks = dict(tenants or {})
        if token and token not in toks:
            toks[token] = DEFAULT_TENANT
        self._expected = [(f"Bearer {t}".encode(), name) for t, name in toks.items()]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._expected:
            tenant = self._tenant(scope)
            if tenant is not None:
                scope[TENANT_KEY] = tenant
            elif scope["path"] not in OPEN_PATHS:
                await _send_json(send, 401, {"detail": "missing or bad bearer token "
                                             "(Authorization)"}, [(b"www-authenticate", b"Bearer")])
                return
        limit = self.max_body
        for method, prefix, cap in self.uploads:
            if scope["method"] == method and scope["path"].startswith(prefix):
                limit = cap
                break
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                await _send_json(send, 400, {"detail": "content-length: not an integer"})
                return
            if n > limit:
                await _send_json(send, 413, {"detail": f"body: larger than {limit} bytes"})
                return
        await self.app(scope, self._limited(receive, limit), send)

    def _tenant(self, scope: Scope) -> str | None:
        """The tenant whose token the request carries; every token compared, none skipped."""
        got = _header(scope, b"authorization") or b""
        found = None
        for expected, name in self._expected:
            if hmac.compare_digest(got, expected):
                found = name
        return found

    def _limited(self, receive: Any, limit: int) -> Any:
        seen = 0

        async def wrapped() -> dict[str, Any]:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return msg

        return wrapped


class BodyTooLarge(TangramError):
    """A request body is larger than the service's limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body: larger than {limit} bytes")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v
    return None
