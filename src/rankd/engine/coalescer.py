"""Merge submissions that arrive together into one engine batch.

Many callers submit at once (connections of a server, tasks of an
application); each submission alone would pay for its own WAL append, commit
(a write, or an fsync under ``always``) and bookkeeping.  The coalescer
collects every submission handed to it during one pass of the event loop
and applies them with a single call of the batch function on the next pass,
then gives each caller its own answers.  Order is kept: callers are served
in the order they called.  :class:`rankd.engine.engine.Engine` puts every
submission through one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError

if TYPE_CHECKING:
    from rankd.engine.submission import Submission

Answers = list[dict[str, Any] | EngineError]

#: A flush never grows past this many submissions (the rest wait one pass).
MAX_COALESCED = 20_000


class SubmitCoalescer:
    """Batches concurrent :meth:`submit_many` calls into calls of ``apply``."""

    def __init__(self, apply: Callable[[list[Submission]], Awaitable[Answers]]) -> None:
        self.apply = apply
        # A deque: a flush takes callers from the front, and a list's pop(0)
        # made taking n callers O(n^2) (50,000 callers held one pass 0.5 s).
        self._pending: deque[tuple[list[Submission], asyncio.Future]] = deque()
        self._pending_count = 0
        self._scheduled = False
        self._running: set[asyncio.Future] = set()
        #: Batches applied, and submissions they carried (for metrics).
        self.flushes = 0
        self.coalesced = 0

    async def submit_many(self, submissions: list[Submission]) -> Answers:
        """``apply(submissions)``, sharing the call with concurrent callers."""
        if not submissions:
            return []
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((submissions, future))
        self._pending_count += len(submissions)
        if not self._scheduled:
            self._scheduled = True
            # call_soon runs after the callbacks already queued: every request
            # that arrived in this pass of the loop gets into the same batch.
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        taken: list[tuple[list[Submission], asyncio.Future]] = []
        count = 0
        while self._pending and (not taken or count + len(self._pending[0][0]) <= MAX_COALESCED):
            item = self._pending.popleft()
            taken.append(item)
            count += len(item[0])
        self._pending_count -= count
        if self._pending:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        task = asyncio.ensure_future(self._apply(taken))
        self._running.add(task)  # a reference, so the task cannot be collected mid-way
        task.add_done_callback(self._running.discard)

    async def _apply(self, taken: list[tuple[list[Submission], asyncio.Future]]) -> None:
        everything = [submission for submissions, _ in taken for submission in submissions]
        self.flushes += 1
        self.coalesced += len(everything)
        try:
            answers = await self.apply(everything)
        except BaseException as exc:  # e.g. read-only: every caller gets the error
            for _, future in taken:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for submissions, future in taken:
            if not future.done():
                future.set_result(answers[start:start + len(submissions)])
            start += len(submissions)
