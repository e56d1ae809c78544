"""`host/tasks.py`'s `cancel_and_wait` (issue 43, mutation testing): a task is cancelled and
waited for, and however it ends (its cancellation, an error, a value) nothing comes out."""

from __future__ import annotations

import asyncio

from arl_tangram.managers.cpu.host.tasks import cancel_and_wait


async def test_none_is_nothing() -> None:
    assert await cancel_and_wait(None) is None


async def test_a_running_task_is_cancelled_and_waited_for() -> None:
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            ended.append("cleaned")

    t = asyncio.create_task(forever())
    await asyncio.sleep(0)
    assert await cancel_and_wait(t) is None
    assert t.cancelled() and ended == ["cleaned"]


async def test_a_task_not_yet_started_is_cancelled() -> None:
    async def body() -> None:
        raise AssertionError("ran")

    t = asyncio.create_task(body())
    await cancel_and_wait(t)
    assert t.cancelled()


async def test_what_the_task_raises_is_swallowed() -> None:
    async def fails() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("while cancelled") from None

    t = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(t)
    assert t.done() and not t.cancelled()
    assert isinstance(t.exception(), RuntimeError)


async def test_a_task_that_ignores_its_cancellation_is_waited_for() -> None:
    async def stubborn() -> int:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)
        return 5

    t = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait(t)
    assert t.done() and t.result() == 5
