"""A node's layer streams (a peer pulling an image's layer) are closed only when idle (issue 43):
a stream a peer keeps reading is never reaped, however long the transfer; one left unread for
more than 300 s is closed when the next stream opens. (The node's clock is a fake: no waiting.)
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.runtime.images import transfer as transfer_mod
from arl_tangram.runtime.node import NodeHost

KEY = "sha256:" + "ab" * 32


class _Stream:
    def __init__(self) -> None:
        self.sent, self.closed, self.done, self.digest, self.size = 0, False, False, KEY, 0

    def next(self) -> bytes:
        self.sent += 1
        return b"x"

    def close(self) -> None:
        self.closed = True


class _Clock:
    """`time` as the transfer module sees it, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> tuple[NodeHost, _Clock, list[_Stream]]:
    made: list[_Stream] = []

    def open_layer(key: str, chunk: int) -> _Stream:
        made.append(_Stream())
        return made[-1]

    clock = _Clock()
    monkeypatch.setattr(transfer_mod, "time", clock)
    cpu = SimpleNamespace(images=SimpleNamespace(open_layer=open_layer))
    h = NodeHost("n0", emit=lambda e: None, cpu_manager=cpu)  # type: ignore[arg-type]
    return h, clock, made


async def test_a_stream_read_all_along_is_never_reaped(
        host: tuple[NodeHost, _Clock, list[_Stream]]) -> None:
    h, clock, made = host
    sid = await h.images.server.open(KEY, 1024)
    for _ in range(10):  # a 50-minute transfer, a chunk every 299 s
        clock.now += 299.0
        assert await h.images.server.next(sid) == b"x"
        await h.images.server.open(KEY, 1024)  # (each open sweeps the idle ones)
    assert not made[0].closed and made[0].sent == 10
    # the ten opened along the way were never read: each closed at the first open more than
    # 300 s after it (two opens later), the last two still open
    assert [s.closed for s in made[1:]] == [True] * 8 + [False, False]
    assert await h.images.server.close(sid) == {"digest": KEY, "bytes": 0}


async def test_an_idle_stream_is_closed_past_300_s_not_before(
        host: tuple[NodeHost, _Clock, list[_Stream]]) -> None:
    h, clock, made = host
    sid = await h.images.server.open(KEY, 1024)
    clock.now += 300.0
    await h.images.server.open(KEY, 1024)
    assert not made[0].closed  # 300 s idle: not past it
    assert await h.images.server.next(sid) == b"x"
    clock.now += 300.5
    await h.images.server.open(KEY, 1024)
    assert made[0].closed and made[1].closed and not made[2].closed
    with pytest.raises(Exception, match="no layer stream"):
        await h.images.server.next(sid)
