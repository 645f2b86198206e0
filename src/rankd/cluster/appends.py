"""Several board groups' log appends in one Postgres round trip.

What it owns: the round trips of :meth:`rankd.cluster.log.ClusterLog.append`.
Every group commits its own records (:mod:`rankd.cluster.committer`, one
append in flight per group); with writes spread over many groups that made
about one record per Postgres transaction, each paying a round trip, a
commit and its WAL flush.  :class:`AppendBatcher` sends the appends of every
group that are ready at the same moment as one statement,
``rankd_append_many``: one transaction for all of them.

Design:

* **When.**  An append asked for while fewer than :data:`MAX_IN_FLIGHT`
  round trips are out is sent at the end of the event-loop pass it was asked
  in, with every other append asked in that pass; once that many are out,
  appends wait and go together in the next one as soon as one returns.  One
  busy group (a committer has one append in flight) therefore still sends
  each append at once, one loop iteration later, as the plain
  ``rankd_append`` of that group alone, and many busy groups share round
  trips.  (Sending an append at once in its caller's task when nothing else
  was out was tried: it spends one of the round trips on a group alone at
  the start of every burst, and bursty clients, the Python TCP client's
  pipelined batches over many groups, measured slower with it in a run of
  bench_groupbatch.py, bench/README.md.)
* **Fencing, per group, as strong as alone.**  ``rankd_append_many`` runs the
  compare-and-set of ``rankd_append`` for each group in turn, inside the one
  transaction: lock the register row, check the epoch and that the batch
  follows ``last_seq``, insert, advance.  A group whose epoch moved on gets
  ``fenced`` and nothing of it is inserted, while the others commit; its
  committer refuses its writers as it always did.
* **No deadlock.**  One transaction now locks several register rows, which
  renewals (:meth:`ClusterLog.renew_many`), takes and cut-overs lock too, in
  their own orders.  The batch locks each row ``SKIP LOCKED``: it never waits,
  so it can never be part of a wait cycle.  A group whose row another
  transaction holds gets ``busy``, is left out of the batch (nothing of it
  inserted) and is sent at once alone, through ``rankd_append``, which waits
  for the lock as a single append always did.
* **Errors.**  When Postgres answers the batch with an error of the
  statement (severity ``ERROR``: the transaction rolled back, nothing of any
  group committed), each group is sent again alone, so that one group's
  error (a damaged log, say) fails only that group's append.  When the
  outcome is unknown (the connection dropped, a timeout, a session ended by
  the server), every group of the batch gets the error, as its own append
  would have: its committer then asks the register how far the log got
  (``GroupCommitter._settle``), which finds records of an append that did
  commit, so they are neither refused nor sent twice.  A crash at any point
  leaves either the whole transaction or none of it, and nothing is
  acknowledged before the commit returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import asyncpg

#: Round trips of appends out at once.  More let a group's append start
#: without waiting for another's commit (Postgres flushes concurrent commits
#: together); fewer put more groups in each.
MAX_IN_FLIGHT = 2
#: Groups in one round trip at most, and their framed bytes at most (an
#: append past the bytes goes in the next round trip, or alone if it is larger).
MAX_GROUPS = 256
MAX_BYTES = 4 << 20

#: The batch function: the compare-and-set of ``rankd_append`` (rankd.cluster.log)
#: for each group of the arrays in turn, in one transaction.  ``i`` is the
#: group's index in the arrays; ``busy`` means its register row was locked by
#: another transaction: nothing of it was inserted, it is to be sent alone.
SCHEMA = """
CREATE OR REPLACE FUNCTION rankd_append_many(
    gs int[], appender_epochs bigint[], firsts bigint[], lasts bigint[], framed bytea[],
    lease float8)
RETURNS TABLE (i int, outcome text, epoch bigint, holder text, last_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    register rankd_groups%ROWTYPE;
BEGIN
    FOR k IN 1 .. coalesce(array_length(gs, 1), 0) LOOP
        i := k;
        SELECT * INTO register FROM rankd_groups r WHERE r.group_id = gs[k]
            FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            SELECT * INTO register FROM rankd_groups r WHERE r.group_id = gs[k];
            epoch := register.epoch; holder := register.holder;
            last_seq := register.last_seq;
            outcome := CASE WHEN FOUND THEN 'busy' ELSE 'fenced' END;
        ELSE
            epoch := register.epoch; holder := register.holder;
            last_seq := register.last_seq;
            IF register.epoch <> appender_epochs[k] THEN
                outcome := 'fenced';
            ELSIF register.last_seq <> firsts[k] - 1 THEN
                outcome := 'sequence';
            ELSE
                INSERT INTO rankd_log (group_id, first_seq, last_seq, epoch, records)
                    VALUES (gs[k], firsts[k], lasts[k], appender_epochs[k], framed[k]);
                UPDATE rankd_groups r SET last_seq = lasts[k],
                    lease_until = now() + make_interval(secs => lease)
                    WHERE r.group_id = gs[k];
                outcome := 'ok'; last_seq := lasts[k];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
"""

APPEND_ONE = "SELECT outcome, epoch, holder, last_seq FROM rankd_append($1, $2, $3, $4, $5, $6)"
APPEND_MANY = ("SELECT i, outcome, epoch, holder, last_seq FROM "
               "rankd_append_many($1, $2, $3, $4, $5, $6)")


@dataclass(frozen=True)
class Outcome:
    """A group's answer to its append: ``ok``, ``fenced`` or ``sequence``,
    and its register's epoch, holder and last position."""

    outcome: str
    epoch: int | None
    holder: str | None
    last_seq: int | None


@dataclass
class _Append:
    group: int
    epoch: int
    first_seq: int
    last_seq: int
    framed: bytes
    done: asyncio.Future[Outcome] = field(repr=False)


def _rolled_back(exc: BaseException) -> bool:
    """Whether Postgres said the statement failed (so its transaction rolled
    back and nothing of it committed), not that the session or the link ended."""
    severity = getattr(exc, "severity_en", None) or getattr(exc, "severity", None)
    return (isinstance(exc, asyncpg.PostgresError)
            and not isinstance(exc, asyncpg.PostgresConnectionError) and severity == "ERROR")


class AppendBatcher:
    """Sends the appends of the groups ready together in one round trip each."""

    def __init__(self, pool: asyncpg.Pool, lease_seconds: float) -> None:
        self.pool = pool
        self.lease_seconds = lease_seconds
        self._ready: list[_Append] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task] = set()  # referenced while they run
        #: Round trips made (a batch, or one group alone), those of several
        #: groups, groups appended through them, and batches that failed and
        #: were sent again per group.
        self.round_trips = 0
        self.batches = 0
        self.appends = 0
        self.split = 0

    async def append(self, group: int, epoch: int, first_seq: int, last_seq: int,
                     framed: bytes) -> Outcome:
        """The compare-and-set append of one group (``rankd_append``'s
        answer), sent with the others ready at the same moment."""
        loop = asyncio.get_running_loop()
        request = _Append(group, epoch, first_seq, last_seq, framed, loop.create_future())
        self._ready.append(request)
        if not self._scheduled and self._in_flight < MAX_IN_FLIGHT:
            self._scheduled = True
            loop.call_soon(self._start)
        # Shielded: a caller that gives up (its committer closing) leaves
        # the round trip, shared with other groups, to end on its own.
        return await asyncio.shield(request.done)

    def _start(self) -> None:
        """At the end of a pass: send what is ready, as round trips allow."""
        self._scheduled = False
        while self._ready and self._in_flight < MAX_IN_FLIGHT:
            batch, size, rest = [], 0, []
            for request in self._ready:
                if batch and (len(batch) >= MAX_GROUPS or size + len(request.framed) > MAX_BYTES
                              or any(b.group == request.group for b in batch)):
                    rest.append(request)
                else:
                    batch.append(request)
                    size += len(request.framed)
            self._ready = rest
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Append]) -> None:
        try:
            if len(batch) == 1:
                await self._alone(batch[0])
            else:
                await self._together(batch)
        finally:
            self._returned()

    def _returned(self) -> None:
        """A round trip ended: what waits for one goes at the end of this pass."""
        self._in_flight -= 1
        if self._ready and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._start)

    async def _alone(self, request: _Append) -> None:
        """One group's append, as ``rankd_append`` (waits for its register's lock)."""
        self.round_trips += 1
        self.appends += 1
        try:
            # No timeout of its own (the pool's command timeout): a Postgres
            # that is only paused answers an append already sent the moment it
            # resumes, before any follower's poll, where a retry on a fresh
            # connection would come after them.  The same holds for a batch.
            async with self.pool.acquire() as conn:
                row = await conn.fetchrow(APPEND_ONE, request.group, request.epoch,
                                          request.first_seq, request.last_seq,
                                          request.framed, self.lease_seconds)
        except BaseException as exc:
            _fail(request, exc)
            if not isinstance(exc, Exception):
                raise
            return
        _answer(request, Outcome(row["outcome"], row["epoch"], row["holder"], row["last_seq"]))

    async def _together(self, batch: list[_Append]) -> None:
        """Several groups in one statement; a group left out (``busy``), or
        every group after an error that rolled the batch back, alone after."""
        # Register rows locked in group order (a batch never waits for a lock,
        # but two batches of one node keep to one order all the same).
        batch.sort(key=lambda request: request.group)
        self.round_trips += 1
        self.batches += 1
        self.appends += len(batch)
        try:
            async with self.pool.acquire() as conn:
                rows = await conn.fetch(
                    APPEND_MANY, [r.group for r in batch], [r.epoch for r in batch],
                    [r.first_seq for r in batch], [r.last_seq for r in batch],
                    [r.framed for r in batch], self.lease_seconds)
        except BaseException as exc:
            if isinstance(exc, Exception) and _rolled_back(exc):
                # Nothing of the batch committed: each group on its own, so
                # that one group's error is only that group's.
                self.split += 1
                self.appends -= len(batch)
                for request in batch:
                    await self._alone(request)
                return
            for request in batch:
                _fail(request, exc)  # the outcome is unknown: each committer settles
            if not isinstance(exc, Exception):
                raise
            return
        again = []
        for row in rows:
            request = batch[row["i"] - 1]
            if row["outcome"] == "busy":
                again.append(request)
            else:
                _answer(request, Outcome(row["outcome"], row["epoch"], row["holder"],
                                         row["last_seq"]))
        self.appends -= len(again)
        for request in again:
            await self._alone(request)


def _answer(request: _Append, outcome: Outcome) -> None:
    if not request.done.done():
        request.done.set_result(outcome)


def _fail(request: _Append, exc: BaseException) -> None:
    if not request.done.done():
        if isinstance(exc, asyncio.CancelledError):
            request.done.cancel()
        else:
            request.done.set_exception(exc)
    with contextlib.suppress(BaseException):
        request.done.exception()  # retrieved: no "never retrieved" warning if nobody waits
