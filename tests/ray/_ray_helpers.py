"""Shared helpers of the Ray tests: an event collector and waiting on conditions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from arl_tangram.core.events import Event

OBJECT_STORE = 80 * 2**20  # bytes of object store per test node


class Collector:
    """The executor's ``emit``: records every event, in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, cls: type) -> list:
        return [e for e in self.events if isinstance(e, cls)]


async def wait_until(pred: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        await asyncio.sleep(0.05)
