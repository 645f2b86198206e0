"""Following the board groups' logs in Postgres, as a follower does.

A :class:`LogTail` hands every committed record of every group it follows
to ``apply(group, records)``, in order and exactly once.  One connection
``LISTEN``s for the log's notifications (one per committed batch, never
per record, naming the group and its new last position); the tail then
reads the group by primary key from the position after the last one it
applied.  Every ``poll_seconds`` it also compares what it applied with
every group's register, since a notification can be lost with the
connection and a new group has none to miss.  When Postgres goes away it
reconnects with backoff and goes on from where it was: what it applied is
never applied again.

It follows every group that has a register, except those :meth:`LogTail.pause`
set aside (the groups this node is the primary of).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from rankd._tasks import STOP_SECONDS, stop_task
from rankd.cluster.groups import GroupLocks
from rankd.cluster.log import CHANNEL, ClusterLog, Compacted
from rankd.postgres_link import POSTGRES_ERRORS, reconnecting

log = logging.getLogger(__name__)

RETRY_MIN_SECONDS = 0.1
RETRY_MAX_SECONDS = 3.0
#: The least time a read of the registers may take before the connection is
#: given up for a new one.
POLL_TIMEOUT_SECONDS = 2.0

Apply = Callable[[int, list[tuple[int, int, bytes]]], Awaitable[None] | None]
#: Loads a group's snapshot in place of its state; returns the snapshot's position.
Bootstrap = Callable[[int], Awaitable[int]]


class LogTail:
    """Applies the logs of the groups it follows, each from its applied position on."""

    def __init__(self, store: ClusterLog, dsn: str, apply: Apply, *,
                 applied: dict[int, int] | None = None, poll_seconds: float = 1.0,
                 batches: int = 100, bootstrap: Bootstrap | None = None,
                 gather_seconds: float = 0.05,
                 rewound: Callable[[int, int], Awaitable[None]] | None = None,
                 polled: Callable[[float, dict[int, int]], None] | None = None) -> None:
        self.store = store
        self.dsn = dsn
        self.apply = apply
        #: Called when the log no longer holds the next position (compacted
        #: into the group's snapshot): the group starts again from that.
        self.bootstrap = bootstrap
        #: Each group's last position handed to ``apply``.
        self.applied: dict[int, int] = dict(applied or {})
        #: Groups not followed (this node writes them).
        self.paused: set[int] = set()
        self.poll_seconds = poll_seconds
        self.batches = batches
        #: After a wake-up, how long to let more batches commit before reading:
        #: one read then takes many (fewer round trips and wake-ups for the
        #: node and for Postgres: bench_cluster.py measured 19,000 against
        #: 20,700 acknowledged writes/s with 10 ms and 50 ms), unless a reader
        #: waits for a position (:meth:`hurry`).
        self.gather_seconds = gather_seconds
        #: Called when a group's log ends before what was applied here (Postgres
        #: lost commits: an asynchronous standby was promoted).
        self.rewound = rewound
        #: Told after each read of the registers: when it started (monotonic,
        #: before the query) and every group's last position then.
        self.polled = polled
        self.connected = False
        #: What the tail is doing now (status, for diagnosis).
        self.stage = "starting"
        #: Each group's last position Postgres told of.
        self.known: dict[int, int] = {}
        self._behind: set[int] = set()
        self._wakeup = asyncio.Event()
        self._hurry = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._advanced = asyncio.Condition()
        #: The lock held while a group is read and applied.
        self.locked = GroupLocks()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rankd-log-tail")

    async def stop(self) -> None:
        await stop_task(self._task, STOP_SECONDS)
        self._task = None

    async def wait_for(self, group: int, seq: int, timeout: float) -> bool:
        """Wait until ``group``'s position ``seq`` was applied
        (read-your-writes); False if ``timeout`` passed first."""
        if self.applied.get(group, 0) < seq:
            self.hurry()
        async with self._advanced:
            try:
                await asyncio.wait_for(self._advanced.wait_for(
                    lambda: self.applied.get(group, 0) >= seq), timeout)
            except TimeoutError:
                return False
        return True

    async def drain(self, group: int, last_seq: int) -> None:
        """Apply ``group``'s log up to ``last_seq`` now and stop following
        it (its new primary opens for writes after this)."""
        self.paused.add(group)
        async with self.locked(group):
            while self.applied.get(group, 0) < last_seq:
                if not await self._read(group):
                    raise RuntimeError(f"group {group}: the log ends before position "
                                       f"{last_seq}")

    def hurry(self) -> None:
        """Someone waits for a position not applied yet (a read with
        ``min_seq``): read as soon as it is committed, without letting
        more batches gather first."""
        self._hurry.set()

    def pause(self, group: int) -> None:
        self.paused.add(group)

    async def resume(self, group: int, applied_seq: int) -> None:
        """Follow ``group`` again from after ``applied_seq``."""
        async with self.locked(group):
            self.applied[group] = applied_seq
            self.paused.discard(group)
            self._behind.add(group)
            self._wakeup.set()

    def _notified(self, connection: object, pid: int, channel: str, payload: str) -> None:
        group_text, _, last = payload.partition(":")
        group, last_seq = int(group_text), int(last)
        self.known[group] = max(self.known.get(group, 0), last_seq)
        if group not in self.paused and last_seq > self.applied.get(group, 0):
            self._behind.add(group)
            self._wakeup.set()

    def _down(self, exc: BaseException) -> None:
        log.warning("log tail cannot reach Postgres: %s", exc)

    async def _run(self) -> None:
        async for conn in reconnecting(self.dsn, down=self._down, timeout=5,
                                       min_delay=RETRY_MIN_SECONDS,
                                       max_delay=RETRY_MAX_SECONDS):
            try:
                self.stage = "listening"
                await conn.add_listener(CHANNEL, self._notified)
                self.connected = True
                while not conn.is_closed():
                    self.stage = "polling the registers"
                    await self._poll(conn)
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + self.poll_seconds
                    while not conn.is_closed() and loop.time() < deadline:
                        if self.gather_seconds and not self._hurry.is_set():
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(self._hurry.wait(),
                                                       self.gather_seconds)
                        self._hurry.clear()
                        await self._catch_up()
                        self._wakeup.clear()
                        if self._behind:
                            continue
                        self.stage = "waiting"
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wakeup.wait(),
                                                   max(0.0, deadline - loop.time()))
            except POSTGRES_ERRORS as exc:
                log.warning("log tail lost Postgres: %s", exc)
            except Exception:  # a damaged batch, a snapshot missing: say so, try again
                log.exception("log tail cannot go on; trying again in %.1fs",
                              self.poll_seconds)
                await asyncio.sleep(self.poll_seconds)
            finally:
                self.connected = False

    async def _poll(self, conn) -> None:
        started = time.monotonic()
        # Bounded: a link gone silent would hold the tail (and the node's
        # freshness) for good, even once the link is back.
        rows = await conn.fetch("SELECT group_id, last_seq FROM rankd_groups",
                                timeout=max(POLL_TIMEOUT_SECONDS, 5 * self.poll_seconds))
        for row in rows:
            group, last_seq = row["group_id"], row["last_seq"]
            if (self.rewound is not None and group not in self.paused
                    and last_seq < self.applied.get(group, 0)):
                await self.rewound(group, last_seq)
            self.known[group] = max(self.known.get(group, 0), last_seq)
            if group not in self.paused and last_seq > self.applied.get(group, 0):
                self._behind.add(group)
        if self.polled is not None:
            self.polled(started, {row["group_id"]: row["last_seq"] for row in rows})

    async def _catch_up(self) -> None:
        while self._behind:
            group = self._behind.pop()
            if group in self.paused:
                continue
            self.stage = f"waiting for group {group}'s lock"
            async with self.locked(group):
                if group in self.paused:
                    continue
                while await self._read(group):
                    pass

    async def _read(self, group: int) -> bool:
        """Read and apply the next batches of ``group``; False if there were none."""
        self.stage = f"reading group {group}"
        try:
            records = await self.store.read(group, self.applied.get(group, 0), self.batches)
        except Compacted:
            if self.bootstrap is None:
                raise
            seq = await self.bootstrap(group)
            async with self._advanced:
                self.applied[group] = seq
                self._advanced.notify_all()
            return True
        if not records:
            return False
        self.stage = f"applying group {group}"
        outcome = self.apply(group, records)
        if outcome is not None:
            await outcome
        async with self._advanced:
            self.applied[group] = records[-1][0]
            self._advanced.notify_all()
        return True
