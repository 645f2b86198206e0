"""Each board group's log in Postgres, and who may append to it.

Two tables (created by :func:`migrate`):

``rankd_groups``
    one *register* row per group: ``epoch``, ``holder`` (a node id),
    ``lease_until`` (Postgres's clock: one clock for every node) and
    ``last_seq``, the group's last committed position.
``rankd_log``
    one row per appended batch, ``(group_id, first_seq)`` its key: its
    positions, the epoch that wrote it, and its records framed as in the
    write-ahead log (``rankd.engine.frames``: CRC-32, length, position,
    payload), so a reader checks every record it takes.

**Appending is a compare-and-set.**  :meth:`ClusterLog.append` locks the
group's register row, checks that the register's epoch is the appender's
and that the batch starts right after ``last_seq``, inserts the batch,
advances ``last_seq`` and renews the lease, all in one transaction; the
followers are notified after it committed (:mod:`rankd.cluster.notifier`
says why not inside it).  A primary that was deposed (its lease ran out, another node
took the group with a higher epoch) therefore cannot append, whatever its
own clock says: its append raises :class:`Fenced` and nothing of it is
committed.  The lease only decides who should *try* to be primary
(:meth:`ClusterLog.take`): safety never depends on timing.

Epochs only grow: taking a group always increments it, even when the taker
held it before, so the appends still in flight from an earlier life of the
same node are fenced too.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass

import asyncpg

from rankd.cluster.appends import SCHEMA as APPEND_MANY_SCHEMA
from rankd.cluster.appends import AppendBatcher
from rankd.cluster.notifier import LogNotifier
from rankd.cluster.section_copy import copy_section
from rankd.engine.errors import NotPrimary
from rankd.engine.frames import frame_many, scan

log = logging.getLogger(__name__)

#: The NOTIFY channel: one notification per committed batch, ``group:last_seq``.
CHANNEL = "rankd_log"
#: A read of the log this large is checked in a worker thread (a follower
#: catching up fetches up to a hundred batches of up to megabytes each).
SCAN_ON_LOOP_BYTES = 256 << 10
#: The most of a snapshot's section read in one row (a larger one in pieces).
SNAPSHOT_PIECE = 1 << 20  # (and the most of one sent in one loop step)
#: Advisory lock serialising migrations (another number than the shipper's).
_MIGRATION_LOCK = 7231002

SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_groups (
    group_id    int PRIMARY KEY,
    epoch       bigint NOT NULL,
    holder      text,
    lease_until timestamptz,
    last_seq    bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS rankd_log (
    group_id  int NOT NULL,
    first_seq bigint NOT NULL,
    last_seq  bigint NOT NULL,
    epoch     bigint NOT NULL,
    records   bytea NOT NULL,
    PRIMARY KEY (group_id, first_seq)
);
CREATE OR REPLACE FUNCTION rankd_append(
    g int, appender_epoch bigint, first bigint, last bigint, framed bytea, lease float8,
    OUT outcome text, OUT epoch bigint, OUT holder text, OUT last_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    register rankd_groups%ROWTYPE;
BEGIN
    SELECT * INTO register FROM rankd_groups WHERE group_id = g FOR UPDATE;
    epoch := register.epoch; holder := register.holder; last_seq := register.last_seq;
    IF NOT FOUND OR register.epoch <> appender_epoch THEN
        outcome := 'fenced';
    ELSIF register.last_seq <> first - 1 THEN
        outcome := 'sequence';
    ELSE
        INSERT INTO rankd_log (group_id, first_seq, last_seq, epoch, records)
            VALUES (g, first, last, appender_epoch, framed);
        UPDATE rankd_groups SET last_seq = last,
            lease_until = now() + make_interval(secs => lease) WHERE group_id = g;
        outcome := 'ok'; last_seq := last;
    END IF;
END $$;
-- Where each epoch of a group began: the group's last committed position
-- when the epoch was taken.  Never compacted (a row per takeover): it tells
-- which positions an epoch committed after the log's batches are gone.
CREATE TABLE IF NOT EXISTS rankd_epochs (
    group_id   int NOT NULL,
    epoch      bigint NOT NULL,
    after_seq  bigint NOT NULL,
    PRIMARY KEY (group_id, epoch)
);
CREATE TABLE IF NOT EXISTS rankd_group_snapshots (
    group_id int NOT NULL,
    seq      bigint NOT NULL,
    epoch    bigint NOT NULL,
    part     int NOT NULL,
    parts    int NOT NULL,
    data     bytea NOT NULL,
    PRIMARY KEY (group_id, seq, part)
);
-- Batches and snapshots are kept as they are, not compressed by TOAST: pglz
-- cost Postgres 5-7x the CPU of a plain insert for an append of 18-187 KiB,
-- and a snapshot's section read a MiB at a time was decompressed from its
-- start for every piece (2 s of Postgres's CPU for a 35 MiB index, against
-- 0.06 s stored plain).  The log is compacted by snapshots, so the space
-- this costs is one snapshot interval's.  Altered only if not yet so (the
-- ALTER takes the table's lock).
DO $$ BEGIN
    IF (SELECT attstorage FROM pg_attribute WHERE attrelid = 'rankd_log'::regclass
        AND attname = 'records') <> 'e' THEN
        ALTER TABLE rankd_log ALTER COLUMN records SET STORAGE EXTERNAL;
    END IF;
    IF (SELECT attstorage FROM pg_attribute WHERE attrelid = 'rankd_group_snapshots'::regclass
        AND attname = 'data') <> 'e' THEN
        ALTER TABLE rankd_group_snapshots ALTER COLUMN data SET STORAGE EXTERNAL;
    END IF;
END $$;
""" + APPEND_MANY_SCHEMA


#: A group's batches after a position.  ``last_seq`` is not indexed: the
#: subquery finds, by the primary key, the batch holding the next position,
#: so a read touches only the batches it returns however long the log is
#: (filtering on ``last_seq`` alone scanned every batch of every group).
READ_BATCHES = (
    "SELECT first_seq, last_seq, epoch, records FROM rankd_log "
    "WHERE group_id = $1 AND last_seq > $2 AND first_seq >= coalesce("
    "(SELECT first_seq FROM rankd_log WHERE group_id = $1 AND first_seq <= $2 + 1 "
    "ORDER BY first_seq DESC LIMIT 1), 0) "
    "ORDER BY first_seq LIMIT $3")


#: Keeps where an epoch began ($1 group, $2 epoch, $3 the last position
#: committed before it), in the transaction that takes the epoch.
RECORD_EPOCH = ("INSERT INTO rankd_epochs (group_id, epoch, after_seq) VALUES ($1, $2, $3) "
                "ON CONFLICT DO NOTHING")

#: :meth:`ClusterLog.last_seq_of_epoch`.  Epochs are taken one by one, so
#: where epoch $2 + 1 began is where $2 ended; the register's end applies
#: only to the current epoch.  An epoch taken by a version before
#: ``rankd_epochs`` left no row: then the epoch's own last batch, while the
#: log holds any (compaction drops a prefix, so its last goes last); once
#: compacted, its end is unknown and the answer errs low, never high (a
#: later epoch's start or the log's start may be far past it): where it
#: began, or the last batch an earlier epoch wrote.
LAST_SEQ_OF_EPOCH = """
SELECT coalesce(
    (SELECT after_seq FROM rankd_epochs WHERE group_id = $1 AND epoch = $2 + 1),
    (SELECT last_seq FROM rankd_groups WHERE group_id = $1 AND epoch = $2),
    (SELECT max(last_seq) FROM rankd_log WHERE group_id = $1 AND epoch = $2),
    greatest((SELECT after_seq FROM rankd_epochs WHERE group_id = $1 AND epoch = $2),
             (SELECT max(last_seq) FROM rankd_log WHERE group_id = $1 AND epoch < $2),
             0))
"""


class Fenced(NotPrimary):
    """The group has a newer epoch than the caller's: it was deposed.  As a
    write's answer: nothing of it was committed."""

    def __init__(self, group: int, mine: int, current: int, holder: str | None) -> None:
        super().__init__(f"group {group} is at epoch {current} (held by {holder!r}); "
                         f"epoch {mine} may no longer append")
        self.group, self.mine, self.current, self.holder = group, mine, current, holder


class Compacted(Exception):
    """The log no longer holds the positions asked for: they are in the
    group's snapshot (:meth:`ClusterLog.snapshot`), and the log goes on
    after it."""

    def __init__(self, group: int, after_seq: int, first_seq: int) -> None:
        super().__init__(f"group {group}: the log starts at position {first_seq}; "
                         f"positions after {after_seq} before it are in its snapshot")
        self.group, self.after_seq, self.first_seq = group, after_seq, first_seq


class OutOfSequence(Exception):
    """A batch that does not start right after the group's last position."""


class _NotKept(Exception):
    """A snapshot's lease moved on before it committed: roll it back."""


@dataclass(frozen=True)
class Lease:
    """A node's right to append to a group: valid while its epoch is current."""

    group: int
    epoch: int
    holder: str
    #: The group's last committed position when the lease was taken.
    last_seq: int


async def lock_schema(conn: asyncpg.Connection) -> None:
    """Within a transaction: wait while another node creates the cluster's
    tables (nodes starting together would race on ``CREATE TABLE IF NOT
    EXISTS``, which fails on a unique index of Postgres's catalog)."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)


async def migrate(conn: asyncpg.Connection) -> None:
    """Create the cluster's tables if they are not there."""
    async with conn.transaction():
        await lock_schema(conn)
        await conn.execute(SCHEMA)


class ClusterLog:
    """The groups' registers and logs, through an asyncpg pool (or anything
    with ``acquire()`` giving connections)."""

    def __init__(self, pool: asyncpg.Pool, *, lease_seconds: float = 4.0) -> None:
        self.pool = pool
        self.lease_seconds = lease_seconds
        #: Tells followers of each committed append, after its commit.
        self.notifier = LogNotifier(pool, CHANNEL)
        #: Sends the appends of groups ready together in one round trip.
        self.appender = AppendBatcher(pool, lease_seconds)
        #: How long a renewal may take.  Renewals start a third of a lease
        #: apart, and one that times out is tried again at once: the second
        #: try still ends well within the lease the last success gave.
        self.renew_seconds = lease_seconds / 4
        #: How long a read of a register may take.
        self.call_seconds = max(lease_seconds, 2.0)

    def _connection(self, seconds: float):
        """A pool connection, got, used (pass ``seconds`` to its query too)
        and given back within about ``seconds`` each.  A connection whose
        far end went away without a word (a reset lost on the way, a
        partition that healed) is given up then, not waited on for the
        pool's command timeout: a renewal waiting so would lose a lease that
        a fresh connection keeps."""
        return self.pool.acquire(timeout=seconds)

    async def take(self, group: int, node: str, *,
                   expired_by: datetime.datetime | None = None) -> Lease | None:
        """Become the group's primary if its lease is free or expired (by
        Postgres's clock): a new epoch.  ``None`` when another node holds a
        lease still valid.

        ``expired_by`` (a time of Postgres's clock, from :meth:`register` or
        a read of the registers) takes another node's lease only if it ran
        out by then: when the taker *saw* it run out, in touch with
        Postgres.  A take sent before Postgres paused and run after it
        resumed would otherwise find every lease run out by the pause,
        before any primary could renew its own (``--ack local``: what only
        that primary holds would be set aside)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO rankd_groups (group_id, epoch, last_seq) VALUES ($1, 0, 0) "
                "ON CONFLICT DO NOTHING", group)
            row = await conn.fetchrow(
                "SELECT epoch, holder, (lease_until < now() OR lease_until IS NULL) AND "
                "(holder IS NULL OR holder = $2 OR $3::timestamptz IS NULL "
                "OR coalesce(lease_until <= $3, true)) AS free, "
                "last_seq FROM rankd_groups WHERE group_id = $1 FOR UPDATE",
                group, node, expired_by)
            if not row["free"] and row["holder"] != node:
                return None
            epoch = row["epoch"] + 1
            await conn.execute(
                "UPDATE rankd_groups SET epoch = $2, holder = $3, "
                "lease_until = now() + make_interval(secs => $4) WHERE group_id = $1",
                group, epoch, node, self.lease_seconds)
            await conn.execute(RECORD_EPOCH, group, epoch, row["last_seq"])
        log.info("node %s took group %d at epoch %d (last position %d)", node, group, epoch,
                 row["last_seq"])
        return Lease(group, epoch, node, row["last_seq"])

    async def renew(self, lease: Lease) -> None:
        """Extend ``lease``; :class:`Fenced` if the group moved on."""
        fenced = await self.renew_many([lease])
        if fenced:
            raise fenced[lease.group]

    async def renew_many(self, leases: list[Lease]) -> dict[int, Fenced]:
        """Extend one holder's ``leases`` in one round trip; returns the
        groups that moved on, each with its :class:`Fenced`."""
        if not leases:
            return {}
        holder = leases[0].holder
        async with self._connection(self.renew_seconds) as conn:
            rows = await conn.fetch(
                "UPDATE rankd_groups AS g SET lease_until = now() + make_interval(secs => $4) "
                "FROM unnest($1::int[], $2::bigint[]) AS held(group_id, epoch) "
                "WHERE g.group_id = held.group_id AND g.epoch = held.epoch AND g.holder = $3 "
                "RETURNING g.group_id",
                [lease.group for lease in leases], [lease.epoch for lease in leases],
                holder, self.lease_seconds, timeout=self.renew_seconds)
            renewed = {row[0] for row in rows}
            fenced: dict[int, Fenced] = {}
            for lease in leases:
                if lease.group not in renewed:
                    try:
                        await self._fenced(conn, lease)
                    except Fenced as exc:
                        fenced[lease.group] = exc
            return fenced

    async def append(self, lease: Lease, first_seq: int, payloads: list[bytes]) -> int:
        """Commit ``payloads`` at positions ``first_seq, first_seq + 1, ...``
        in one transaction, if ``lease`` is still the group's epoch and the
        batch starts right after its last position; renews the lease, and
        once committed notifies followers (in the background).  Returns the
        new last position.  Raises :class:`Fenced` or :class:`OutOfSequence`,
        having committed nothing."""
        if not payloads:
            raise ValueError("an empty batch")
        last_seq = first_seq + len(payloads) - 1
        framed = frame_many(first_seq, payloads)
        # One round trip, shared with the other groups ready at the same
        # moment (rankd.cluster.appends): the compare-and-set runs in Postgres.
        row = await self.appender.append(lease.group, lease.epoch, first_seq, last_seq, framed)
        if row.outcome == "fenced":
            raise Fenced(lease.group, lease.epoch,
                         row.epoch if row.epoch is not None else -1, row.holder)
        if row.outcome == "sequence":
            raise OutOfSequence(f"group {lease.group} is at position {row.last_seq}; "
                                f"a batch from {first_seq} does not follow it")
        self.notifier.note(lease.group, last_seq)
        return last_seq

    async def read(self, group: int, after_seq: int, limit: int = 100
                   ) -> list[tuple[int, int, bytes]]:
        """``(seq, epoch, payload)`` of the committed records after
        ``after_seq``, in order, from at most ``limit`` batches; every
        record's checksum and position are checked."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(READ_BATCHES, group, after_seq, limit)
        out: list[tuple[int, int, bytes]] = []
        expected = after_seq + 1
        if rows and rows[0]["first_seq"] > expected:
            raise Compacted(group, after_seq, rows[0]["first_seq"])
        if not rows:  # a log that starts with a snapshot (rankd cluster migrate-slots)
            async with self.pool.acquire() as conn:
                kept = await conn.fetchval(
                    "SELECT max(seq) FROM rankd_group_snapshots WHERE group_id = $1", group)
            if kept is not None and kept > after_seq:
                raise Compacted(group, after_seq, kept + 1)
        if sum(len(row["records"]) for row in rows) > SCAN_ON_LOOP_BYTES:
            # A node loading a group from far behind reads megabytes at once:
            # checked in a worker thread, the event loop serves meanwhile.
            return await asyncio.to_thread(_scanned, group, rows, expected, out)
        return _scanned(group, rows, expected, out)

    async def register(self, group: int) -> dict | None:
        """The group's register row (epoch, holder, lease_until, last_seq),
        ``lease_left``: seconds its lease still holds by Postgres's clock,
        and ``at``: Postgres's time of the read."""
        async with self._connection(self.call_seconds) as conn:
            row = await conn.fetchrow(
                "SELECT epoch, holder, lease_until, last_seq, "
                "extract(epoch FROM lease_until - now())::float8 AS lease_left, now() AS at "
                "FROM rankd_groups WHERE group_id = $1", group, timeout=self.call_seconds)
        return None if row is None else dict(row)

    async def store_snapshot(self, lease: Lease, seq: int, epoch: int,
                             sections: list[bytes], covers: int | None = None) -> bool:
        """Keep ``sections``, the group's state from position ``seq``
        (written at ``epoch``; it may hold records up to ``covers``, which
        the log from ``seq`` sets again: ``Engine.group_snapshot``), as its
        snapshot, if ``lease`` is still the group's epoch and the log holds
        ``covers`` (so every record in the state is committed); then drop
        the snapshot before it and the log up to it: the log keeps one
        snapshot interval, so a follower that far behind still catches up
        from the log.  False if the lease moved on or the log does not hold
        ``covers`` yet (nothing kept)."""
        covers = seq if covers is None else max(covers, seq)
        async with self.pool.acquire() as conn:
            try:
                async with conn.transaction():
                    # The sections go in before the register is locked: the
                    # group's appends and lease renewals wait for that lock,
                    # and copying a large state takes seconds; the check and
                    # the commit take a moment.  One statement a section, not
                    # executemany: cancelled while it waits to stream more of
                    # a large batch, executemany swallows the cancellation and
                    # waits for Postgres to answer messages it never finished
                    # (a node leaving hung so until the command timeout).
                    for part, data in enumerate(sections):
                        if len(data) > SNAPSHOT_PIECE:
                            await copy_section(conn, lease.group, seq, epoch, part,
                                               len(sections), data, SNAPSHOT_PIECE)
                            continue
                        await conn.execute(
                            "INSERT INTO rankd_group_snapshots (group_id, seq, epoch, part, "
                            "parts, data) VALUES ($1, $2, $3, $4, $5, $6) "
                            "ON CONFLICT DO NOTHING",
                            lease.group, seq, epoch, part, len(sections), data)
                    row = await conn.fetchrow("SELECT epoch, last_seq FROM rankd_groups "
                                              "WHERE group_id = $1 FOR UPDATE", lease.group)
                    if (row is None or row["epoch"] != lease.epoch
                            or row["last_seq"] < covers):
                        raise _NotKept
            except _NotKept:
                return False
            # What the new snapshot replaces goes in a transaction of its own,
            # without the register's lock: it is committed already.
            async with conn.transaction():
                before = await conn.fetchval("SELECT max(seq) FROM rankd_group_snapshots "
                                             "WHERE group_id = $1 AND seq < $2", lease.group,
                                             seq)
                if before is not None:
                    await conn.execute("DELETE FROM rankd_group_snapshots WHERE group_id = $1 "
                                       "AND seq < $2", lease.group, seq)
                    await conn.execute("DELETE FROM rankd_log WHERE group_id = $1 "
                                       "AND last_seq <= $2", lease.group, before)
        return True

    async def snapshot_seq(self, group: int) -> int:
        """The position of the group's newest snapshot (0: none)."""
        async with self.pool.acquire() as conn:
            return await conn.fetchval("SELECT coalesce(max(seq), 0) FROM "
                                       "rankd_group_snapshots WHERE group_id = $1", group)

    async def snapshot(self, group: int) -> tuple[int, int, list[bytes]] | None:
        """The group's newest snapshot: ``(seq, epoch, sections)``."""
        # One view of the table: a newer snapshot may replace this one between
        # the two reads.
        async with self.pool.acquire() as conn, conn.transaction(
                isolation="repeatable_read", readonly=True):
            seq = await conn.fetchval("SELECT max(seq) FROM rankd_group_snapshots "
                                      "WHERE group_id = $1", group)
            if seq is None:
                return None
            # A section over SNAPSHOT_PIECE bytes comes in pieces of it, joined
            # in a worker thread (CPython joins megabytes without the GIL):
            # asyncpg parses a row in one loop step, and a board's 25 MB index
            # as one row, or joined on the loop, held it 25-130 ms.
            rows = await conn.fetch(
                "SELECT epoch, part, parts, length(data) AS size, CASE WHEN "
                "length(data) <= $3 THEN data END AS data FROM rankd_group_snapshots "
                "WHERE group_id = $1 AND seq = $2 ORDER BY part", group, seq, SNAPSHOT_PIECE)
            sections = [row["data"] if row["data"] is not None else await asyncio.to_thread(
                b"".join, [await conn.fetchval(
                    "SELECT substring(data FROM $4 FOR $5) FROM rankd_group_snapshots "
                    "WHERE group_id = $1 AND seq = $2 AND part = $3",
                    group, seq, row["part"], start + 1, SNAPSHOT_PIECE)
                    for start in range(0, row["size"], SNAPSHOT_PIECE)]) for row in rows]
        if not rows or len(rows) != rows[0]["parts"]:
            raise RuntimeError(f"group {group}: the snapshot at {seq} in Postgres is "
                               "incomplete")
        return seq, rows[0]["epoch"], [bytes(section) for section in sections]

    async def epoch_at(self, group: int, seq: int) -> int | None:
        """The epoch that committed position ``seq`` of ``group`` (None if
        the log does not hold it)."""
        async with self.pool.acquire() as conn:
            return await conn.fetchval(
                "SELECT epoch FROM rankd_log WHERE group_id = $1 AND first_seq <= $2 "
                "AND last_seq >= $2", group, seq)

    async def last_seq_of_epoch(self, group: int, epoch: int) -> int:
        """The last position of ``group`` committed while ``epoch`` was its
        epoch: where the next epoch began (``rankd_epochs``), or the log's
        end while ``epoch`` is current.  A record this node wrote under
        ``epoch`` past it was never committed.

        When the next epoch was taken by a version before ``rankd_epochs``,
        the last batch ``epoch`` wrote is the bound; once snapshots
        compacted those away the answer is a lower bound (where ``epoch``
        began): a record set aside that was committed is answered as a
        duplicate when resubmitted by its event id, one counted as committed
        that was not would be lost."""
        async with self.pool.acquire() as conn:
            return await conn.fetchval(LAST_SEQ_OF_EPOCH, group, epoch)

    async def release(self, lease: Lease, *, idle: bool = False) -> None:
        """Give ``lease`` up: another node may take the group at once.  A node
        leaving keeps its name as holder, so the others take its groups over
        at once (failover); a group given up ``idle`` has no holder, and is
        taken by the next write to it.  Nothing if the group already moved on."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE rankd_groups SET lease_until = now(), "
                "holder = CASE WHEN $3 THEN NULL ELSE holder END "
                "WHERE group_id = $1 AND epoch = $2", lease.group, lease.epoch, idle)

    async def _fenced(self, conn: asyncpg.Connection, lease: Lease,
                      row: asyncpg.Record | None = None) -> None:
        if row is None:
            row = await conn.fetchrow("SELECT epoch, holder FROM rankd_groups WHERE "
                                      "group_id = $1", lease.group)
        raise Fenced(lease.group, lease.epoch, row["epoch"] if row else -1,
                     row["holder"] if row else None)


def _scanned(group: int, rows: list, expected: int, out: list[tuple[int, int, bytes]]
             ) -> list[tuple[int, int, bytes]]:
    """Append to ``out`` the records of ``rows`` (log batches) from position
    ``expected`` on, each one's checksum and position checked."""
    for row in rows:
        found = scan(bytes(row["records"]), row["first_seq"])
        if found.bad is not None or found.next_lsn != row["last_seq"] + 1:
            raise RuntimeError(f"group {group}: the batch at {row['first_seq']} in "
                               f"Postgres is damaged ({found.bad})")
        for seq, payload in found.records:
            if seq >= expected:
                if seq != expected:
                    raise RuntimeError(f"group {group}: position {expected} is missing "
                                       "from the log in Postgres")
                out.append((seq, row["epoch"], payload))
                expected += 1
    return out
