"""Asyncio helpers the manager side shares.

Runs in: the service process (asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """``task`` (None: nothing) cancelled and waited for; however it ends is swallowed (its
    cancellation, or what it raised meanwhile)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
