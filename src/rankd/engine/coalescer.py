"""Merge submissions that arrive together into one engine batch.

Many callers submit at once (connections of a server, tasks of an
application); each submission alone would pay for its own WAL append, commit
(a write, or an fsync under ``always``) and bookkeeping.  The coalescer
collects every submission handed to it during one pass of the event loop
and applies them with a single call of the batch function on the next pass,
then gives each caller its own answers.  Order is kept: callers are served
in the order they called.  :class:`rankd.engine.engine.Engine` puts every
submission through one.

A batch is applied in one callback of the event loop (the ingest of every
submission in it, then its log append), so a flush takes at most
``MAX_COALESCED`` submissions, splitting a caller's list across flushes
if need be: the rest go in the next passes, in order, and the caller gets
all its answers at once.  Only a list longer than a flush is split: one
that fits but not in the room left waits whole for the next flush.
One call of 20,000 submissions held the loop 30-45 ms in one callback
(see bench/README.md).  A caller's submissions never were one
transaction: each gets its own answer.  So when the batch of one part
of a split list fails, the error is the answer of each submission of
the part (an :class:`~rankd.engine.errors.EngineError` as it is; a bug
as ``ReadOnly``: the engine then refuses writes), and every other part
has its own outcome (the next part may already be applied: parts go out
a pass apart, each without waiting for the one before to be committed);
a list that fits one flush gets the error raised, as it always did.
Parts of a list waiting for a board held by a store keep their order
behind each other (:meth:`rankd.engine.submits.Submits.submit_batch`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError, ReadOnly

if TYPE_CHECKING:
    from rankd.engine.submission import Submission

Answers = list[dict[str, Any] | EngineError]

#: A flush never takes more than this many submissions (the rest wait a
#: pass): at about 6 us a submission on the general path, a few ms.
MAX_COALESCED = 1_000


class _Caller:
    """One ``submit_many`` call waiting for its answers."""

    __slots__ = ("answers", "future", "given", "submissions", "taken")

    def __init__(self, submissions: list[Submission], future: asyncio.Future) -> None:
        self.submissions = submissions
        self.future = future
        self.answers: Answers = [None] * len(submissions)  # type: ignore[list-item]
        self.taken = 0  # submissions handed to flushes so far
        self.given = 0  # answers filled in so far

    def answer(self, start: int, answers: Answers) -> None:
        self.answers[start:start + len(answers)] = answers
        self.given += len(answers)
        if self.given == len(self.submissions) and not self.future.done():
            self.future.set_result(self.answers)


class SubmitCoalescer:
    """Batches concurrent :meth:`submit_many` calls into calls of ``apply``."""

    def __init__(self, apply: Callable[[list[Submission]], Awaitable[Answers]]) -> None:
        self.apply = apply
        # A deque: a flush takes callers from the front, and a list's pop(0)
        # made taking n callers O(n^2) (50,000 callers held one pass 0.5 s).
        self._pending: deque[_Caller] = deque()
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
        caller = _Caller(submissions, loop.create_future())
        self._pending.append(caller)
        self._pending_count += len(submissions)
        if not self._scheduled:
            self._scheduled = True
            # call_soon runs after the callbacks already queued: every request
            # that arrived in this pass of the loop gets into the same batch.
            loop.call_soon(self._flush)
        return await caller.future

    def _flush(self) -> None:
        self._scheduled = False
        parts: list[tuple[_Caller, int, int]] = []
        count = 0
        while self._pending and count < MAX_COALESCED:
            caller = self._pending[0]
            start = caller.taken
            if count and count + len(caller.submissions) - start > MAX_COALESCED >= len(
                    caller.submissions):
                break  # a list that fits one flush goes whole, in the next (see above)
            end = min(len(caller.submissions), start + MAX_COALESCED - count)
            parts.append((caller, start, end))
            caller.taken = end
            count += end - start
            if end == len(caller.submissions):
                self._pending.popleft()
        self._pending_count -= count
        if self._pending:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        task = asyncio.ensure_future(self._apply(parts))
        self._running.add(task)  # a reference, so the task cannot be collected mid-way
        task.add_done_callback(self._running.discard)

    async def _apply(self, parts: list[tuple[_Caller, int, int]]) -> None:
        everything = [submission for caller, start, end in parts
                      for submission in caller.submissions[start:end]]
        self.flushes += 1
        self.coalesced += len(everything)
        try:
            answers = await self.apply(everything)
        except BaseException as exc:  # e.g. read-only: every caller gets the error
            for caller, start, end in parts:
                if caller.future.done():
                    continue
                if end - start < len(caller.submissions) and isinstance(exc, Exception):
                    # A part (see above): its own error, not the call's.  A
                    # bug has turned the engine read-only, this part unlogged.
                    caller.answer(start, [_part_error(exc)] * (end - start))
                else:
                    caller.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        at = 0
        for caller, start, end in parts:
            if not caller.future.done():
                caller.answer(start, answers[at:at + end - start])
            at += end - start


def _part_error(exc: Exception) -> EngineError:
    """The answer of each submission of a split list's part whose batch
    raised ``exc``: an engine error as it is; anything else is a bug, after
    which the engine refuses writes (``Submits.submit_batch``) and the part
    was not logged."""
    if isinstance(exc, EngineError):
        return exc
    return ReadOnly(f"rankd stopped accepting writes after an internal error ({exc!r}); "
                    "this part of the batch was not logged")
