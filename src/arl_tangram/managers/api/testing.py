"""A real HTTP provider on loopback for the API manager's tests and benchmarks (issue 37): an asyncio server
speaking HTTP/1.1 with keep-alive that enforces a real limit -- a token bucket of ``rate``
requests/s with ``burst``, and ``concurrency`` requests at once -- and answers 429 *without
headers* past it, as Serper does. It counts what it saw (requests, per query, 429s, the most
in flight at once, the keys' headers). Paths: ``/search`` (answers after ``latency_s``),
``/hang`` (never answers), ``/garbage`` (200, not JSON), ``/die`` (closes the connection),
``/fail`` (500), ``/leak`` (400 echoing the key), ``/retry-after`` (429 with ``Retry-After: 1``, then answers)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any


class ProviderServer:
    def __init__(self, rate: float = 50.0, burst: float = 50.0, concurrency: int = 16,
                 latency_s: float = 0.02) -> None:
        self.rate, self.burst, self.concurrency, self.latency_s = rate, burst, concurrency, latency_s
        self.tokens = burst
        self.t = time.monotonic()
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        self.answered = 0
        self.rejected = 0  # 429s
        self.queries: Counter[str] = Counter()
        self.auth: list[str] = []
        self.retry_after_sent = 0
        self.answer_times: list[float] = []
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> ProviderServer:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # (hung handlers are cancelled with the loop's other tasks)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _admit(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1.0 or self.in_flight >= self.concurrency:
            return False
        self.tokens -= 1.0
        return True

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                n = int(headers.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                if not await self._handle(method, path, headers, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # (the loop closing under an idle keep-alive connection)
            return
        finally:
            writer.close()

    def _send(self, writer: asyncio.StreamWriter, code: int, body: bytes,
              extra: dict[str, str] | None = None, ctype: str = "application/json") -> None:
        reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(code, "X")
        hdrs = {"content-type": ctype, "content-length": str(len(body)), **(extra or {})}
        head = f"HTTP/1.1 {code} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        writer.write(head.encode() + b"\r\n" + body)

    async def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        self.requests += 1
        for h in ("authorization", "x-api-key"):
            if h in headers:
                self.auth.append(headers[h])
        if path.startswith("/hang"):
            await asyncio.sleep(3600)
        if path.startswith("/die"):
            return False
        if path.startswith("/garbage"):
            self._send(writer, 200, b"<html>rate limited, try later</html>", ctype="text/html")
            return True
        if path.startswith("/leak"):  # a provider that echoes the key back in an error
            self._send(writer, 400, json.dumps({"error": f"bad key {headers.get('authorization')}"}).encode())
            return True
        if path.startswith("/fail"):
            self._send(writer, 500, b'{"error": "boom"}')
            return True
        if path.startswith("/retry-after") and self.retry_after_sent == 0:
            self.retry_after_sent += 1
            self._send(writer, 429, b"", {"retry-after": "1"})
            return True
        if not self._admit():
            self.rejected += 1
            self._send(writer, 429, b"")  # no Retry-After, no rate headers
            return True
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            req: dict[str, Any] = json.loads(body or b"{}")
            q = str(req.get("q", req.get("url", "")))
            self.queries[q] += 1
            await asyncio.sleep(self.latency_s)
        finally:
            self.in_flight -= 1
        self.answered += 1
        self.answer_times.append(time.monotonic())
        self._send(writer, 200, json.dumps({"organic": [{"title": f"about {q}"}]}).encode())
        return True
