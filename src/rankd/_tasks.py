"""Background tasks: the one way rankd's services stop theirs, and futures
whose outcome nobody may await."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging

log = logging.getLogger(__name__)

#: How long a service that must stop in bounded time (a cluster node
#: leaving) waits for each of its tasks.
STOP_SECONDS = 5.0


async def stop_task(task: asyncio.Task | None, timeout: float | None = None) -> bool:
    """Cancel ``task`` (if any) and wait until it has finished, re-raising
    what it raised other than its cancellation.

    With ``timeout``, wait at most that many seconds: a task still running
    then (one that swallowed its cancellation, or awaits something that
    ignores it) is logged with its stack and left behind, so that a stuck
    task cannot hold a shutdown forever.  Returns whether it finished."""
    if task is None:
        return True
    task.cancel()
    if timeout is None:
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True
    await asyncio.wait({task}, timeout=timeout)
    if not task.done():
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.warning("task %s did not stop within %.1fs of its cancellation; left "
                    "behind:\n%s", task.get_name(), timeout, stack.getvalue().rstrip())
        return False
    if not task.cancelled():
        task.result()
    return True


def outcome_seen(done: asyncio.Future) -> None:
    """A done callback for a future given up on before it ended (a wait
    that timed out through ``asyncio.shield``): marks its exception as seen,
    which asyncio would otherwise log as never retrieved."""
    if not done.cancelled():
        done.exception()
