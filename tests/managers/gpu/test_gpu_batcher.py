"""The dynamic batcher's promises (managers/gpu/batcher.py's invariant) on a fake run function,
no model (issue 27, mutation testing): every request gets exactly one answer -- its output, or
a BrokenError saying why, whatever the run did (raised anything, left the action out) -- even
when another waiter of its batch gave up; requests that arrive during the batching wait share
one batch; the batcher keeps serving after a wake-up that found its queue empty; a closed
batcher says so."""

from __future__ import annotations

import asyncio

import pytest

from arl_tangram.core.actions import ActionKind, ActionSpec
from arl_tangram.core.errors import BrokenError, ClosedError
from arl_tangram.managers.gpu import BatchOutcome
from arl_tangram.managers.gpu.batcher import DynamicBatcher


def _act(aid: str) -> ActionSpec:
    return ActionSpec(aid, kind=ActionKind.REWARD, model="m", payload={})


class _Run:
    """Scores each action ``len(id)``; ``fail``: raise it instead; ``skip``: ids left out."""

    def __init__(self, fail: Exception | None = None, skip: tuple[str, ...] = (),
                 delay: float = 0.0) -> None:
        self.fail, self.skip, self.delay = fail, skip, delay
        self.batches: list[list[str]] = []

    async def __call__(self, iid: str, actions: list[ActionSpec]) -> BatchOutcome:
        self.batches.append([a.id for a in actions])
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return BatchOutcome(outputs={a.id: {"score": len(a.id)} for a in actions
                                     if a.id not in self.skip},
                            failed={a.id: "too long" for a in actions if a.id == "failed"},
                            batch_size=len(actions))


async def _close(b: DynamicBatcher) -> None:
    await b.aclose()


async def test_a_failed_run_answers_every_waiter_with_a_broken_error_naming_why() -> None:
    b = DynamicBatcher(_Run(fail=RuntimeError("CUDA out of memory")), lambda _: 8, 0.0)
    try:
        got = await asyncio.wait_for(asyncio.gather(
            b.submit("i", _act("a")), b.submit("i", _act("b")), return_exceptions=True), 5.0)
        assert [type(x) for x in got] == [BrokenError, BrokenError]
        assert [str(x) for x in got] == ["CUDA out of memory"] * 2
    finally:
        await _close(b)


async def test_an_action_the_run_left_out_is_an_error_naming_it() -> None:
    b = DynamicBatcher(_Run(skip=("gone", "failed")), lambda _: 8, 0.0)
    try:
        got = await asyncio.wait_for(asyncio.gather(
            b.submit("i", _act("ok")), b.submit("i", _act("gone")),
            b.submit("i", _act("failed")), return_exceptions=True), 5.0)
        assert got[0] == {"score": 2}
        assert isinstance(got[1], BrokenError) and str(got[1]) == "action gone: no output for this action"
        assert isinstance(got[2], BrokenError) and str(got[2]) == "action failed: too long"
    finally:
        await _close(b)


async def test_the_others_of_a_batch_are_answered_when_one_waiter_gave_up() -> None:
    run = _Run(delay=0.1)
    b = DynamicBatcher(run, lambda _: 8, 0.0)
    try:
        first = asyncio.ensure_future(b.submit("i", _act("a")))
        rest = [asyncio.ensure_future(b.submit("i", _act(x))) for x in ("bb", "ccc")]
        await asyncio.sleep(0.02)  # the batch [a, bb, ccc] is running
        first.cancel()
        assert await asyncio.wait_for(asyncio.gather(*rest), 5.0) == [{"score": 2}, {"score": 3}]
        assert run.batches == [["a", "bb", "ccc"]]
    finally:
        await _close(b)


async def test_requests_during_the_wait_share_a_batch_and_serving_goes_on() -> None:
    run = _Run()
    b = DynamicBatcher(run, lambda _: 8, 0.3)  # below the knee: wait 0.3 s for more
    try:
        a = asyncio.ensure_future(b.submit("i", _act("a")))
        await asyncio.sleep(0.05)  # (inside the wait)
        bb = asyncio.ensure_future(b.submit("i", _act("bb")))
        assert await asyncio.wait_for(asyncio.gather(a, bb), 5.0) == [{"score": 1}, {"score": 2}]
        assert run.batches == [["a", "bb"]] and b.batch_sizes == [2]
        # `bb`'s wake-up found its request already taken: the loop still serves what comes next
        assert await asyncio.wait_for(b.submit("i", _act("ccc")), 5.0) == {"score": 3}
    finally:
        await _close(b)


async def test_a_closed_batcher_refuses_new_requests() -> None:
    b = DynamicBatcher(_Run(), lambda _: 8, 0.0)
    await b.aclose()
    with pytest.raises(ClosedError, match=r"^the GPU manager's batcher is closed$"):
        await b.submit("i", _act("a"))


async def test_a_batch_never_exceeds_the_instances_knee() -> None:
    run = _Run(delay=0.05)
    b = DynamicBatcher(run, lambda _: 1, 0.0)
    try:
        got = await asyncio.wait_for(asyncio.gather(*(b.submit("i", _act(x)) for x in "abc")), 5.0)
        assert got == [{"score": 1}] * 3
        assert run.batches == [["a"], ["b"], ["c"]] and b.batch_sizes == [1, 1, 1]
    finally:
        await _close(b)


async def _one_running_one_queued(b: DynamicBatcher) -> tuple[asyncio.Future, asyncio.Future]:
    running = asyncio.ensure_future(b.submit("i", _act("a")))
    await asyncio.sleep(0.05)  # `a` runs (0.5 s); with a knee of 1, `b` waits in the queue
    queued = asyncio.ensure_future(b.submit("i", _act("b")))
    await asyncio.sleep(0.01)
    return running, queued


async def test_dropping_an_instance_fails_its_queued_requests_and_a_new_one_starts_afresh() -> None:
    b = DynamicBatcher(_Run(delay=0.5), lambda _: 1, 0.0)
    try:
        running, queued = await _one_running_one_queued(b)
        other = asyncio.ensure_future(b.submit("j", _act("cc")))  # another instance: untouched
        b.drop("i", "instance i was unloaded")
        with pytest.raises(BrokenError, match=r"^instance i was unloaded$"):
            await asyncio.wait_for(queued, 5.0)
        running.cancel()
        assert await asyncio.wait_for(other, 5.0) == {"score": 2}
        # the instance id is free again: a request for it is served by a new loop
        assert await asyncio.wait_for(b.submit("i", _act("ddd")), 5.0) == {"score": 3}
    finally:
        await _close(b)


async def test_closing_fails_queued_requests_saying_so() -> None:
    b = DynamicBatcher(_Run(delay=0.5), lambda _: 1, 0.0)
    running, queued = await _one_running_one_queued(b)
    await b.aclose()
    with pytest.raises(BrokenError, match=r"^the GPU manager was closed$"):
        await asyncio.wait_for(queued, 5.0)
    running.cancel()
