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


def http_protocol() -> type:
    """uvicorn's "auto" HTTP protocol (httptools when it imports, else h11), coalescing; for
    ``uvicorn.run(app, http=http_protocol())``."""
    proto: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        proto = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        proto = H11Protocol
    return coalescing(proto)
