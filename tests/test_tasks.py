"""Stopping background tasks: a stop that must end in bounded time does,
even when a task will not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from rankd._tasks import stop_task


def test_a_task_is_cancelled_and_awaited_and_its_failure_raised():
    async def scenario():
        stopped = []

        async def worker():
            try:
                await asyncio.sleep(60)
            finally:
                stopped.append(True)

        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        assert await stop_task(task, 1.0) is True
        assert task.cancelled() and stopped == [True]
        assert await stop_task(None, 1.0) is True

        async def failing():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                raise RuntimeError("broke while stopping") from None

        for timeout in (None, 1.0):
            task = asyncio.create_task(failing())
            await asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="broke while stopping"):
                await stop_task(task, timeout)

    asyncio.run(scenario())


def test_a_task_that_ignores_its_cancellation_is_left_behind_with_its_stack(caplog):
    async def scenario():
        release = asyncio.Event()

        async def stubborn():
            while not release.is_set():
                # What a library swallowing a cancellation does.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(stubborn(), name="stubborn-task")
        await asyncio.sleep(0)
        started = time.monotonic()
        assert await stop_task(task, 0.3) is False
        assert 0.3 <= time.monotonic() - started < 2.0
        assert not task.done()
        release.set()
        await task

    with caplog.at_level(logging.WARNING, logger="rankd._tasks"):
        asyncio.run(scenario())
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert "stubborn-task did not stop within 0.3s" in message
    assert "in stubborn" in message  # the stack shows where it is stuck
