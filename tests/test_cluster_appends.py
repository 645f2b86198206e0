"""Several groups' log appends in one Postgres round trip
(rankd.cluster.appends), in a real Postgres: each group's compare-and-set is
as strong as alone (a fenced group commits nothing, the others commit), a
batch Postgres rolls back is sent again per group, a batch whose outcome is
unknown is settled by each group's committer from its register, and a group
whose register another transaction holds never makes the batch wait."""

from __future__ import annotations

import asyncio

import asyncpg

from rankd.cluster.committer import GroupCommitter
from rankd.cluster.log import ClusterLog, Fenced, migrate


async def _open(dsn: str, lease: float = 5.0) -> ClusterLog:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    async with pool.acquire() as conn:
        await migrate(conn)
    return ClusterLog(pool, lease_seconds=lease)


async def _payloads(store: ClusterLog, group: int) -> list[bytes]:
    return [payload for _, _, payload in await store.read(group, 0)]


def test_a_fenced_group_in_a_batch_commits_nothing_and_the_others_commit(pg_dsn):
    async def scenario():
        store = await _open(pg_dsn, lease=0.3)
        try:
            leases = {g: await store.take(g, "a") for g in (101, 102, 103, 104)}
            await asyncio.sleep(0.5)  # every lease runs out; b takes 102 only
            taker = await store.take(102, "b")
            before = store.appender.round_trips
            answers = await asyncio.gather(
                *(store.append(leases[g], 1, [f"{g}-1".encode(), f"{g}-2".encode()])
                  for g in (101, 102, 103, 104)), return_exceptions=True)
            # All four were ready in one pass: one statement, one transaction.
            assert store.appender.round_trips - before == 1
            assert store.appender.batches == 1
            assert answers[0] == answers[2] == answers[3] == 2
            assert isinstance(answers[1], Fenced)
            assert answers[1].current == taker.epoch and answers[1].holder == "b"
            for g in (101, 103, 104):
                assert await _payloads(store, g) == [f"{g}-1".encode(), f"{g}-2".encode()]
                assert (await store.register(g))["last_seq"] == 2
            assert await _payloads(store, 102) == []
            register = await store.register(102)
            assert register["last_seq"] == 0 and register["epoch"] == taker.epoch
            # The new primary appends from where the log is, in a batch too.
            assert await store.append(taker, 1, [b"b-1"]) == 1
            assert await _payloads(store, 102) == [b"b-1"]
        finally:
            await store.pool.close()

    asyncio.run(scenario())


def test_a_postgres_error_mid_batch_commits_none_of_it_and_each_group_is_sent_alone(pg_dsn):
    """One group's log is damaged (a row where its next batch goes): the
    batch's insert fails, the transaction rolls back; sent again one group
    at a time, the others commit once each and only that group fails."""
    async def scenario():
        store = await _open(pg_dsn)
        try:
            leases = {g: await store.take(g, "a") for g in (201, 202, 203)}
            async with store.pool.acquire() as conn:
                await conn.execute("INSERT INTO rankd_log (group_id, first_seq, last_seq, "
                                   "epoch, records) VALUES (202, 1, 1, 0, ''::bytea)")
            answers = await asyncio.gather(
                *(store.append(leases[g], 1, [f"{g}".encode()]) for g in (201, 202, 203)),
                return_exceptions=True)
            assert store.appender.split == 1
            assert answers[0] == answers[2] == 1
            assert isinstance(answers[1], asyncpg.UniqueViolationError)
            assert await _payloads(store, 201) == [b"201"]
            assert await _payloads(store, 203) == [b"203"]
            assert (await store.register(202))["last_seq"] == 0
        finally:
            await store.pool.close()

    asyncio.run(scenario())


def test_a_batch_whose_session_ends_midway_is_settled_by_each_committer_once(pg_dsn):
    """The batch's session is ended while it waits inside its transaction
    (outcome unknown to the node): every group's committer asks its
    register, appends again, and each record is committed exactly once."""
    async def scenario():
        store = await _open(pg_dsn)
        blocker = await asyncpg.connect(pg_dsn)
        try:
            groups = (301, 302, 303, 304)
            writers = {g: GroupCommitter(store, await store.take(g, "a")) for g in groups}
            blocking = blocker.transaction()
            await blocking.start()
            await blocker.execute("LOCK TABLE rankd_log IN SHARE MODE")  # inserts wait
            commits = [asyncio.ensure_future(writers[g].commit([f"{g}-{i}".encode()
                                                                for i in range(3)]))
                       for g in groups]
            pid = None
            for _ in range(200):
                # (Not from the blocker: a transaction sees one snapshot of
                # pg_stat_activity.)
                async with store.pool.acquire() as conn:
                    pid = await conn.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE query LIKE "
                        "'%rankd_append_many%' AND wait_event_type = 'Lock' "
                        "AND pid <> pg_backend_pid()")
                if pid is not None:
                    break
                await asyncio.sleep(0.02)
            assert pid is not None, "the batch never waited in Postgres"
            assert await blocker.fetchval("SELECT pg_terminate_backend($1)", pid)
            await asyncio.sleep(0.1)
            await blocking.commit()
            assert await asyncio.wait_for(asyncio.gather(*commits), 30) == [3] * len(groups)
            assert store.appender.split == 0  # not known rolled back: settled, not split
            for g in groups:
                assert await _payloads(store, g) == [f"{g}-{i}".encode() for i in range(3)]
                assert writers[g].fenced is None and writers[g].committed_seq == 3
            for writer in writers.values():
                await writer.close()
        finally:
            await blocker.close()
            await store.pool.close()

    asyncio.run(scenario())


def test_a_group_whose_register_is_locked_does_not_hold_up_the_batch(pg_dsn):
    """Another transaction holds one group's register (a renewal, a take):
    the batch commits the others at once and sends that group alone, which
    waits for the lock as a single append does."""
    async def scenario():
        store = await _open(pg_dsn)
        holder = await asyncpg.connect(pg_dsn)
        try:
            leases = {g: await store.take(g, "a") for g in (401, 402, 403)}
            holding = holder.transaction()
            await holding.start()
            await holder.execute("SELECT 1 FROM rankd_groups WHERE group_id = 402 FOR UPDATE")
            appends = {g: asyncio.ensure_future(store.append(leases[g], 1, [b"x"]))
                       for g in (401, 402, 403)}
            done, _ = await asyncio.wait([appends[401], appends[403]], timeout=10)
            assert len(done) == 2 and not appends[402].done()
            assert (await store.register(401))["last_seq"] == 1
            await holding.commit()
            assert await asyncio.wait_for(appends[402], 10) == 1
            assert await _payloads(store, 402) == [b"x"]
        finally:
            await holder.close()
            await store.pool.close()

    asyncio.run(scenario())


def test_one_busy_group_sends_at_once_and_many_share_round_trips(pg_dsn):
    """A lone group's appends each go out at once (one round trip each, no
    waiting for company); 40 groups committing together use far fewer."""
    async def scenario():
        store = await _open(pg_dsn)
        try:
            lone = GroupCommitter(store, await store.take(500, "a"))
            for i in range(5):
                assert await lone.commit([b"r%d" % i]) == i + 1
            assert store.appender.round_trips == 5
            writers = [GroupCommitter(store, await store.take(g, "a")) for g in range(501, 541)]
            before = store.appender.round_trips
            for _ in range(3):
                await asyncio.gather(*(w.commit([b"a", b"b"]) for w in writers))
            assert store.appender.round_trips - before <= 12  # not 120
            assert all(w.committed_seq == 6 for w in writers)
            for writer in [lone, *writers]:
                await writer.close()
        finally:
            await store.pool.close()

    asyncio.run(scenario())
