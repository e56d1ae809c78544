"""One write per small HTTP response: a uvicorn protocol whose transport joins the head of a
response with the body written right after it.

uvicorn writes a response's status line and headers (on ``http.response.start``) and its body
(on ``http.response.body``) with two ``transport.write`` calls: a small JSON answer costs two
TCP segments, two syscalls and two wake-ups of the client, and on a busy machine the first
wake-up can preempt the server before it writes the body.

Invariant: bytes go out in the order written and unchanged. At most one write is held back,
and only until the next write, the end of the current event-loop iteration (``call_soon``),
or a ``close`` / ``write_eof`` (which flush it first), whichever comes first. A held write
whose connection is already closing is dropped (its peer is gone, as an unheld one would be).
"""

from __future__ import annotations

import asyncio
import fcntl
import sys
import termios
from typing import Any


class CoalescingTransport:
    """Wraps a transport; holds one write back so the next one in the same step joins it."""

    __slots__ = ("_held", "_loop", "_t")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._t, self._loop = transport, loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        self._t.write(held + bytes(data))

    def flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._t.is_closing():
            self._t.write(held)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def close(self) -> None:
        self.flush()
        self._t.close()

    def abort(self) -> None:
        self._held = None
        self._t.abort()

    def get_write_buffer_size(self) -> int:
        return int(self._t.get_write_buffer_size()) + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._t, name)


def coalescing(protocol_cls: type) -> type:
    """A subclass of the uvicorn HTTP protocol ``protocol_cls`` that writes through a
    `CoalescingTransport`."""

    class Coalescing(protocol_cls):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))

    Coalescing.__name__ = Coalescing.__qualname__ = f"Coalescing{protocol_cls.__name__}"
    return Coalescing


PENDING_GRACE_S = 1.0  # a connection waits this long for its headers before it may be dropped


class ConnectionGuard:
    """Slow clients (issue 35, M4): the deadlines and caps of one server's connections.

    uvicorn bounds none of these: a connection that never finishes its headers is held for
    ever (an fd each: ~1,000 of them stop a server at the common 1,024-fd limit), and a body
    that stops arriving holds its request (and an upload's spool file) for ever. Here:

    - a request's headers must be whole within ``header_timeout_s`` of the connection (of the
      first byte of the next request, on a kept-alive one), else the connection is closed;
    - while the server waits for a request's body, ``body_timeout_s`` without a byte closes it
      (the app sees a disconnect: an upload's spool is removed); not while the server itself
      has paused reading (a slow app is not a slow client);
    - connections that have not finished their first request's headers (no token seen yet) are
      at most ``max_per_ip`` from one address and ``max_pending`` in all, so that they hold a
      bounded number of fds: past ``max_pending``, the longest waiting of them with no byte
      waiting to be read is dropped at once; past ``max_per_ip``, once it has also waited
      `PENDING_GRACE_S` (a burst of clients that each send at once, a trainer opening its pool
      of 1,500 connections, is not cut; an idle attacker's connections are).

    Kept-alive connections between requests are uvicorn's (``timeout_keep_alive``). The caps'
    bookkeeping takes the time as an argument (``now``, the loop's clock) and answers when it
    wants to look again (`arrived`, `sweep`); the protocol (`guarded`) keeps the timer.
    """

    def __init__(self, *, header_timeout_s: float, body_timeout_s: float, max_per_ip: int,
                 max_pending: int, grace_s: float = PENDING_GRACE_S) -> None:
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.max_per_ip, self.max_pending, self.grace_s = max_per_ip, max_pending, grace_s
        # protocols before their first headers -> when they came, oldest first; and per address
        self.pending: dict[Any, float] = {}
        self.by_ip: dict[str, dict[Any, float]] = {}
        self.sweep_at: float | None = None  # a sweep is scheduled for then (`guarded`)

    def arrived(self, proto: Any, ip: str, now: float) -> float | None:
        """A new connection; the time to `sweep` at, when one is due and none is scheduled."""
        self.pending[proto] = now
        self.by_ip.setdefault(ip, {})[proto] = now
        return self.sweep(now, (ip,))

    def left(self, proto: Any, ip: str) -> None:
        """``proto`` finished its first headers, or its connection ended."""
        if self.pending.pop(proto, None) is not None:
            mine = self.by_ip.get(ip)
            if mine is not None:
                mine.pop(proto, None)
                if not mine:
                    del self.by_ip[ip]

    def sweep(self, now: float, ips: tuple[str, ...] | None = None) -> float | None:
        """Drop what passes a cap and may be dropped (see the class doc), for ``ips`` (None:
        every address); the time to look again while a cap is still passed (None: none, or a
        sweep is scheduled already)."""
        due: float | None = None
        for ip in (list(self.by_ip) if ips is None else ips):
            mine = self.by_ip.get(ip)
            if mine is not None and len(mine) > self.max_per_ip:
                due = _earliest(due, self._cut(mine, len(mine) - self.max_per_ip, now,
                                               self.grace_s))
        if len(self.pending) > self.max_pending:
            due = _earliest(due, self._cut(self.pending, len(self.pending) - self.max_pending,
                                           now, 0.0))
        if due is None or (self.sweep_at is not None and self.sweep_at <= due):
            return None
        self.sweep_at = due
        return due

    def _cut(self, waiting: dict[Any, float], over: int, now: float,
             grace_s: float) -> float | None:
        """Drop up to ``over`` of ``waiting``, oldest first, of those that have waited
        ``grace_s`` and have no byte to read; when fewer could be, the time to look again."""
        for proto, since in list(waiting.items()):
            if over <= 0:
                return None
            if since + grace_s > now:
                return since + grace_s
            if proto._guard_unread():  # (its request is there, not read yet: no attacker)
                continue
            self.left(proto, proto._guard_ip)
            proto._guard_close(abort=True)
            over -= 1
        return None if over <= 0 else now + max(grace_s, 0.05)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def guarded(protocol_cls: type, guard: ConnectionGuard) -> type:
    """A subclass of uvicorn's httptools protocol ``protocol_cls`` kept by ``guard``."""

    class Guarded(protocol_cls):
        _guard_ip = ""
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _in_headers = False  # a request began and its headers are not whole yet
        _in_body = False  # its headers are whole and its body is not

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._guard_ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            self._header_timer = self.loop.call_later(guard.header_timeout_s, self._header_late)
            self._guard_sweep_at(guard.arrived(self, self._guard_ip, self.loop.time()))

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            guard.left(self, self._guard_ip)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # timers only for what is left incomplete after this read (a request that comes in
            # one read costs none but its connection's first)
            if self._in_headers and self._header_timer is None:  # a kept-alive one's next
                self._header_timer = self.loop.call_later(guard.header_timeout_s,
                                                          self._header_late)
            elif self._in_body:  # (re)armed by every read of the body
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self.loop.call_later(guard.body_timeout_s, self._body_late)

        def handle_websocket_upgrade(self) -> None:
            self._disarm()  # (the connection is the websocket protocol's now)
            self._in_headers = self._in_body = False
            super().handle_websocket_upgrade()

        # parser callbacks (httptools)
        def on_message_begin(self) -> None:
            self._in_headers = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            guard.left(self, self._guard_ip)
            super().on_headers_complete()
            self._in_body = True

        def on_message_complete(self) -> None:
            self._in_body = False
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            super().on_message_complete()

        def _guard_sweep_at(self, when: float | None) -> None:
            if when is not None:
                loop = self.loop
                loop.call_at(when, lambda: self._guard_swept(loop))

        @staticmethod
        def _guard_swept(loop: asyncio.AbstractEventLoop) -> None:
            guard.sweep_at = None
            again = guard.sweep(loop.time())
            if again is not None:
                loop.call_at(again, lambda: Guarded._guard_swept(loop))

        def _guard_unread(self) -> bool:
            """Bytes wait in the socket for this server to read them."""
            sock: Any = self.transport.get_extra_info("socket") if self.transport else None
            try:
                buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
            except (AttributeError, OSError, ValueError):
                return False
            return int.from_bytes(buf, sys.byteorder) > 0

        def _disarm(self) -> None:
            for t in (self._header_timer, self._body_timer):
                if t is not None:
                    t.cancel()
            self._header_timer = self._body_timer = None

        def _header_late(self) -> None:
            self._header_timer = None
            guard.left(self, self._guard_ip)
            self._guard_close(abort=False)

        def _body_late(self) -> None:
            self._body_timer = None
            if self.flow is not None and self.flow.read_paused:  # the app is slow, not the peer
                self._body_timer = self.loop.call_later(guard.body_timeout_s, self._body_late)
                return
            self._guard_close(abort=False)

        def _guard_close(self, *, abort: bool) -> None:
            self._disarm()
            t = self.transport
            if t is not None and not t.is_closing():
                if abort:
                    t.abort()
                else:
                    t.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{protocol_cls.__name__}"
    return Guarded


def http_protocol(guard: ConnectionGuard | None = None) -> type:
    """uvicorn's "auto" HTTP protocol (httptools when it imports, else h11), coalescing, and
    kept by ``guard`` (httptools only); for ``uvicorn.run(app, http=http_protocol(...))``."""
    proto: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        proto = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return coalescing(H11Protocol)
    proto = coalescing(proto)
    return guarded(proto, guard) if guard is not None else proto


def guard_of(limits: Any) -> ConnectionGuard:
    """The guard a service config's ``limits`` (`LimitsConfig`) ask for."""
    return ConnectionGuard(header_timeout_s=float(limits.header_timeout_s),
                           body_timeout_s=float(limits.body_timeout_s),
                           max_per_ip=int(limits.max_connections_per_ip),
                           max_pending=int(limits.max_pending_connections))
