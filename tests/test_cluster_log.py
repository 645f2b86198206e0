"""The cluster's log in a real Postgres: appends are a compare-and-set on
the group's epoch, so a deposed primary can never append, whatever its
clock says; positions stay contiguous; epochs only grow."""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import random
import time
import zlib

import asyncpg
import pytest

from rankd.cluster.groups import GROUPS, group_of
from rankd.cluster.log import READ_BATCHES, ClusterLog, Fenced, OutOfSequence, migrate
from rankd.engine.groups import SLOTS, legacy_group_of, slot_of, slots_of_group


def test_board_groups_are_redis_cluster_slot_ranges():
    assert GROUPS == 1024 and SLOTS == 16384
    # The CRC16 of Redis's cluster spec (XMODEM): its own test vector.
    assert slot_of("123456789") == 12739 and binascii.crc_hqx(b"123456789", 0) == 0x31C3
    # What `CLUSTER KEYSLOT` of a real redis-server answers (docs/cluster.md).
    assert {k: slot_of(k) for k in ("arena", "weekly-cup", "été", "{cup}:daily",
                                    "a{cup}b{x}", "{}x", "foo{}{bar}", "foo{{bar}}zap")} == {
        "arena": 14505, "weekly-cup": 5480, "été": 10087, "{cup}:daily": 2816,
        "a{cup}b{x}": 2816, "{}x": 10595, "foo{}{bar}": 8363, "foo{{bar}}zap": 4015}
    for board in ("arena", "weekly-cup", "été", "x" * 64):
        assert group_of(board) == slot_of(board) // 16 == slot_of(board.encode()) // 16
        assert slot_of(board) in slots_of_group(group_of(board))
    assert [group_of(b) for b in ("arena", "weekly-cup", "été")] == [906, 342, 630]
    assert len({group_of(f"board-{i}") for i in range(10_000)}) > 1000  # spread out
    # Clusters of before grouped by CRC-32: kept only to migrate them.
    assert legacy_group_of("arena") == zlib.crc32(b"arena") % 1024 == 987


async def _open(dsn: str, lease: float = 5.0) -> ClusterLog:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    async with pool.acquire() as conn:
        await migrate(conn)
    return ClusterLog(pool, lease_seconds=lease)


def run(coro):
    return asyncio.run(coro)


def test_the_holder_appends_contiguous_batches_read_back_checked(pg_dsn):
    async def scenario():
        store = await _open(pg_dsn)
        try:
            lease = await store.take(7, "a")
            assert lease.epoch == 1 and lease.last_seq == 0
            assert await store.append(lease, 1, [b"r1", b"r2"]) == 2
            assert await store.append(lease, 3, [b"r3"]) == 3
            with pytest.raises(OutOfSequence):
                await store.append(lease, 3, [b"again"])  # a retry after a lost answer
            with pytest.raises(OutOfSequence):
                await store.append(lease, 9, [b"gap"])
            assert await store.read(7, 0) == [(1, 1, b"r1"), (2, 1, b"r2"), (3, 1, b"r3")]
            assert await store.read(7, 2) == [(3, 1, b"r3")]
            assert (await store.register(7))["last_seq"] == 3
            assert await store.take(7, "b") is None  # a valid lease is not taken
        finally:
            await store.pool.close()

    run(scenario())


def test_a_deposed_primary_cannot_append_whatever_its_clock_says(pg_dsn):
    """The SIGSTOP case: the primary sleeps past its lease, another node
    takes the group, the sleeper wakes up and tries to append."""
    async def scenario():
        store = await _open(pg_dsn, lease=0.3)
        try:
            sleeper = await store.take(1, "a")
            await store.append(sleeper, 1, [b"before"])
            await asyncio.sleep(0.5)  # the lease runs out in Postgres's time
            taker = await store.take(1, "b")
            assert taker.epoch == sleeper.epoch + 1 and taker.last_seq == 1
            with pytest.raises(Fenced) as fenced:
                await store.append(sleeper, 2, [b"from the past"])
            assert fenced.value.current == taker.epoch and fenced.value.holder == "b"
            with pytest.raises(Fenced):
                await store.renew(sleeper)
            await store.append(taker, 2, [b"after"])
            assert [r[2] for r in await store.read(1, 0)] == [b"before", b"after"]
            # Taking a group again always moves the epoch on, even for the
            # node that held it: its own stale appends are fenced too.
            await asyncio.sleep(0.5)
            again = await store.take(1, "b")
            assert again.epoch == taker.epoch + 1
            with pytest.raises(Fenced):
                await store.append(taker, 3, [b"stale"])
        finally:
            await store.pool.close()

    run(scenario())


def test_a_take_names_when_it_saw_the_lease_run_out(pg_dsn):
    """``expired_by``: another node's lease is taken only if it had run out
    by the time the taker read it (a take decided on an older read, sent
    while Postgres was paused and run after, finds the pause's expiry and
    is refused); a lease nobody holds, or the taker's own, takes no such
    proof."""
    async def scenario():
        store = await _open(pg_dsn, lease=0.3)
        try:
            held = await store.take(2, "a")
            seen = (await store.register(2))["at"]  # read while the lease held
            await asyncio.sleep(0.5)  # it runs out later, unseen (Postgres "paused")
            assert await store.take(2, "b", expired_by=seen) is None
            assert (await store.register(2))["epoch"] == held.epoch
            seen = await store.register(2)
            assert seen["lease_left"] < 0  # read once it had run out
            taker = await store.take(2, "b", expired_by=seen["at"])
            assert taker is not None and taker.epoch == held.epoch + 1
            # The holder itself takes its group again on any read.
            again = await store.take(2, "b", expired_by=seen["at"])
            assert again is not None and again.epoch == taker.epoch + 1
            # A group given up idle has no holder: nothing to prove.
            await store.release(again, idle=True)
            assert (await store.take(2, "c", expired_by=seen["at"])).epoch == again.epoch + 1
        finally:
            await store.pool.close()

    run(scenario())


def test_an_epochs_committed_end_survives_the_compaction_of_its_batches(pg_dsn):
    """A restarted ``--ack local`` primary sets aside what it wrote under
    its epoch past that epoch's committed end.  Once the next primaries'
    snapshots compacted the log past that end, the batches no longer say
    where it was (taking the log's start, every position counted as
    committed: acknowledged writes the new primary rewrote were lost);
    where the next epoch began, kept per takeover, still does."""
    from rankd.cluster.placement import Placement
    from rankd.cluster.placement import migrate as migrate_placement

    async def scenario():
        store = await _open(pg_dsn, lease=0.2)
        try:
            first = await store.take(5, "a")
            await store.append(first, 1, [b"a1", b"a2", b"a3"])
            assert await store.last_seq_of_epoch(5, first.epoch) == 3  # current: the log's end
            await asyncio.sleep(0.4)  # "a" is gone; "b" takes over at 3
            second = await store.take(5, "b")
            assert second.last_seq == 3
            for start in range(4, 40, 6):
                await store.append(second, start, [b"b%d" % i for i in range(start, start + 6)])
            assert await store.store_snapshot(second, 15, second.epoch, [b"s15"])
            assert await store.store_snapshot(second, 30, second.epoch, [b"s30"])
            assert (await store.read(5, 15))[0][0] == 16  # compacted past position 3
            assert await store.last_seq_of_epoch(5, first.epoch) == 3
            assert await store.last_seq_of_epoch(5, second.epoch) == 39
            # A move's hand-over keeps where its epoch began too.
            async with store.pool.acquire() as conn:
                await migrate_placement(conn)
            third = await Placement(store.pool).hand_over(5, second.epoch, "b", "c", 1, 5.0)
            assert third == second.epoch + 1
            await store.append(type(second)(5, third, "c", 39), 40, [b"c40"])
            assert await store.store_snapshot(type(second)(5, third, "c", 40), 40, third,
                                              [b"s40"])
            assert await store.last_seq_of_epoch(5, second.epoch) == 39
            assert await store.last_seq_of_epoch(5, first.epoch) == 3
            assert await store.last_seq_of_epoch(5, third) == 40
        finally:
            await store.pool.close()

    run(scenario())


def test_racing_takers_get_one_epoch_each_and_only_one_wins(pg_dsn):
    async def scenario():
        store = await _open(pg_dsn, lease=0.2)
        try:
            epochs = []
            for _ in range(5):
                leases = await asyncio.gather(*(store.take(3, f"n{i}") for i in range(6)))
                won = [lease for lease in leases if lease is not None]
                assert len(won) == 1
                epochs.append(won[0].epoch)
                await asyncio.sleep(0.3)
            assert epochs == sorted(set(epochs))  # strictly growing
        finally:
            await store.pool.close()

    run(scenario())


def test_random_histories_keep_the_log_contiguous_and_fenced(pg_dsn):
    """Three nodes take, append and sleep at random (seeded); the checker:
    every acknowledged append is in the log exactly once, in order, written
    by the epoch that was current; a fenced append left nothing; epochs
    never go back."""
    async def scenario(seed: int):
        rng = random.Random(seed)
        store = await _open(pg_dsn, lease=0.15)
        group = 100 + seed
        leases = {}
        acknowledged = []  # (first_seq, payloads, epoch)
        refused = []
        seen_epochs = []
        try:
            for step in range(60):
                node = rng.choice("abc")
                action = rng.random()
                if action < 0.25:
                    lease = await store.take(group, node)
                    if lease is not None:
                        leases[node] = lease
                        seen_epochs.append(lease.epoch)
                elif action < 0.85 and node in leases:
                    lease = leases[node]
                    register = await store.register(group)
                    first = register["last_seq"] + 1
                    payloads = [f"{node}-{step}-{i}".encode() for i in range(rng.randint(1, 4))]
                    try:
                        await store.append(lease, first, payloads)
                    except (Fenced, OutOfSequence):
                        refused.append(payloads)
                    else:
                        acknowledged.append((first, payloads, lease.epoch))
                else:
                    await asyncio.sleep(rng.choice([0.0, 0.05, 0.2]))
            records = await store.read(group, 0, limit=10_000)
        finally:
            await store.pool.close()
        expected = [(first + i, epoch, payload) for first, payloads, epoch in acknowledged
                    for i, payload in enumerate(payloads)]
        assert records == expected, seed
        assert [r[0] for r in records] == list(range(1, len(records) + 1))
        written = {r[2] for r in records}
        assert not written & {p for payloads in refused for p in payloads}
        assert seen_epochs == sorted(seen_epochs)
        committed_epochs = [r[1] for r in records]
        assert committed_epochs == sorted(committed_epochs)
        return len(acknowledged), len(refused)

    totals = [run(scenario(seed)) for seed in range(4)]
    assert sum(a for a, _ in totals) > 20 and sum(r for _, r in totals) > 0, totals


def test_a_damaged_batch_in_postgres_is_never_read_as_records(pg_dsn):
    async def scenario():
        store = await _open(pg_dsn)
        try:
            lease = await store.take(9, "a")
            await store.append(lease, 1, [b"good", b"also good"])
            async with store.pool.acquire() as conn:
                await conn.execute("UPDATE rankd_log SET records = set_byte(records, 20, 0) "
                                   "WHERE group_id = 9")
            with pytest.raises(RuntimeError, match="damaged"):
                await store.read(9, 0)
        finally:
            await store.pool.close()

    run(scenario())


def test_a_read_touches_only_the_batches_it_returns_however_long_the_log(pg_dsn):
    """A follower reads after every commit: reading must not cost more as
    the log of its group, or of every other group, grows."""
    async def scenario():
        store = await _open(pg_dsn)
        try:
            lease = await store.take(3, "a")
            sizes = [random.Random(5).randint(1, 4) for _ in range(60)]
            seq = 1
            for size in sizes:
                await store.append(lease, seq, [f"r{seq + i}".encode() for i in range(size)])
                seq += size
            async with store.pool.acquire() as conn:  # other groups' long logs
                await conn.execute(
                    "INSERT INTO rankd_log (group_id, first_seq, last_seq, epoch, records) "
                    "SELECT 100 + n % 50, n, n, 1, '\\x00' FROM generate_series(1, 20000) n")
                await conn.execute("ANALYZE rankd_log")
            last = seq - 1
            for after in (0, 1, last // 2, last - 3, last - 1, last):
                records = await store.read(3, after)
                assert [r[0] for r in records] == list(range(after + 1, last + 1))
                assert [r[2] for r in records] == [f"r{i}".encode()
                                                   for i in range(after + 1, last + 1)]
            tuples = ("SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables "
                      "WHERE relname = 'rankd_log'")
            async with store.pool.acquire() as conn, conn.transaction():
                before = await conn.fetchval(tuples)
                assert len(await conn.fetch(READ_BATCHES, 3, last - 3, 100)) >= 1
                touched = await conn.fetchval(tuples) - before
            assert touched <= 4, touched  # the batches read, and the one before
        finally:
            await store.pool.close()

    run(scenario())


def test_group_commit_puts_many_submitters_in_one_transaction_and_fences_them_all(pg_dsn):
    from rankd.cluster.committer import GroupCommitter

    async def scenario():
        store = await _open(pg_dsn, lease=0.5)
        try:
            lease = await store.take(11, "a")
            committer = GroupCommitter(store, lease)

            async def submitter(n: int) -> list[int]:
                return [await committer.commit([f"{n}-{i}".encode()]) for i in range(20)]

            positions = await asyncio.gather(*(submitter(n) for n in range(32)))
            flat = sorted(p for mine in positions for p in mine)
            assert flat == list(range(1, 641))  # each once, no gap
            assert committer.appends < 640 / 4  # shared transactions
            records = await store.read(11, 0, limit=10_000)
            assert sorted(r[2] for r in records) == sorted(
                f"{n}-{i}".encode() for n in range(32) for i in range(20))
            # Deposed: every waiting and later commit fails, nothing more is written.
            await asyncio.sleep(0.7)
            await store.take(11, "b")
            results = await asyncio.gather(*(committer.commit([b"late"]) for _ in range(10)),
                                           return_exceptions=True)
            assert all(isinstance(r, Fenced) for r in results)
            with pytest.raises(Fenced):
                await committer.commit([b"later"])
            assert len(await store.read(11, 0, limit=10_000)) == 640
        finally:
            await store.pool.close()

    run(scenario())


def test_a_kept_lease_is_renewed_and_a_stalled_node_stops_acknowledging_first(pg_dsn):
    """While the keeper renews, no other node can take the group.  When the
    keeper stalls (a paused process), the node stops acknowledging by its
    own clock before Postgres lets another node take the group; when it
    comes back fenced, it drops the lease and says so."""
    from rankd.cluster.leases import LeaseKeeper

    async def scenario():
        store = await _open(pg_dsn, lease=0.6)
        try:
            lost = []
            keeper = LeaseKeeper(store, "a", on_lost=lambda g, exc: lost.append((g, exc)))
            lease = await keeper.take(21)
            assert lease is not None and keeper.may_acknowledge(21)
            await keeper.start()
            for _ in range(6):  # three lease lengths: renewed all along
                await asyncio.sleep(0.3)
                assert await store.take(21, "b") is None
                assert keeper.may_acknowledge(21)
            await keeper.stop()  # the node stalls from here
            stalled_at = time.monotonic()
            while keeper.may_acknowledge(21):
                await asyncio.sleep(0.01)
            stopped_after = time.monotonic() - stalled_at
            taken = None
            while taken is None:
                taken = await store.take(21, "b")
                await asyncio.sleep(0.01)
            taken_after = time.monotonic() - stalled_at
            assert stopped_after < taken_after, (stopped_after, taken_after)
            await keeper.renew_all()  # it wakes up: fenced
            assert lost and lost[0][0] == 21 and lost[0][1].holder == "b"
            assert keeper.lease(21) is None and not keeper.may_acknowledge(21)
            return stopped_after, taken_after
        finally:
            await store.pool.close()

    stopped_after, taken_after = run(scenario())
    assert taken_after - stopped_after > 0.05  # a margin, not a coincidence


def test_a_follower_applies_the_log_once_in_order_across_a_postgres_restart(pg_cluster):
    """The tail wakes on NOTIFY, reads by key, and after Postgres restarts
    (stopped with -m immediate under load) goes on from where it was."""
    from rankd.cluster.committer import GroupCommitter
    from rankd.cluster.tail import LogTail

    dsn = pg_cluster.admin_dsn

    async def commit_until_done(committer, payload: bytes) -> int:
        for _ in range(200):
            try:
                return await committer.commit([payload])
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await asyncio.sleep(0.05)
        raise AssertionError("Postgres did not come back")

    async def scenario():
        store = await _open(dsn, lease=60)
        applied = []
        tail = LogTail(store, dsn, lambda group, records: applied.extend(records),
                       poll_seconds=0.5)
        try:
            await tail.start()
            committer = GroupCommitter(store, await store.take(5, "a"))
            waits = []
            for i in range(100):
                seq = await commit_until_done(committer, f"r{i}".encode())
                started = time.monotonic()
                assert await tail.wait_for(5, seq, 5)
                waits.append(time.monotonic() - started)
            await asyncio.to_thread(pg_cluster.stop, "immediate")
            await asyncio.sleep(0.3)
            await asyncio.to_thread(pg_cluster.start)
            last = 0
            for i in range(100, 150):
                last = await commit_until_done(committer, f"r{i}".encode())
            assert await tail.wait_for(5, last, 20)
            logged = await store.read(5, 0, limit=10_000)
        finally:
            await tail.stop()
            await store.pool.close()
        assert applied == logged and [r[0] for r in applied] == list(range(1, len(logged) + 1))
        assert {r[2] for r in applied} >= {f"r{i}".encode() for i in range(150)}
        return sorted(waits)

    waits = run(scenario())
    assert waits[len(waits) // 2] < 0.25  # woken by NOTIFY, not by the 0.5 s poll


def test_a_reader_waiting_for_a_position_is_not_kept_waiting_by_the_gathering(pg_dsn):
    """The tail lets batches gather before it reads (fewer round trips),
    but a read with ``min_seq`` waits for it: that read is served as soon
    as the position commits, not a gathering later."""
    from rankd.cluster.committer import GroupCommitter
    from rankd.cluster.tail import LogTail

    async def scenario():
        store = await _open(pg_dsn, lease=60)
        applied = []
        tail = LogTail(store, pg_dsn, lambda group, records: applied.extend(records),
                       poll_seconds=30, gather_seconds=3.0)
        try:
            await tail.start()
            committer = GroupCommitter(store, await store.take(6, "a"))
            await committer.commit([b"first"])
            await asyncio.sleep(0.2)  # the tail woke and gathers for 3 s now
            assert applied == []
            seq = await committer.commit([b"second"])
            started = time.monotonic()
            assert await tail.wait_for(6, seq, 2.0)
            waited = time.monotonic() - started
        finally:
            await tail.stop()
            await store.pool.close()
        assert [r[2] for r in applied] == [b"first", b"second"]
        return waited

    assert run(scenario()) < 1.0


def test_a_primary_partitioned_from_postgres_stops_and_is_fenced_when_it_returns(pg_server):
    """Node a reaches Postgres through a proxy that blackholes, then resets
    the link; node b takes the group meanwhile.  a stops acknowledging by
    its own clock before b can take over, nothing a sends once b holds the
    group is committed, and b's writes follow a's acknowledged ones with no
    gap."""
    from urllib.parse import urlsplit, urlunsplit

    from nemesis import Proxy
    from rankd.cluster.committer import GroupCommitter
    from rankd.cluster.leases import LeaseKeeper

    dsn = pg_server.create_database()
    parts = urlsplit(dsn)
    proxy = Proxy(parts.port)
    proxied = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))

    async def scenario():
        direct = await _open(dsn, lease=0.6)
        via_proxy = ClusterLog(await asyncpg.create_pool(proxied, min_size=1, max_size=4,
                                                         command_timeout=5), lease_seconds=0.6)
        acknowledged, refused = [], []
        try:
            keeper_a = LeaseKeeper(via_proxy, "a")
            lease_a = await keeper_a.take(31)
            await keeper_a.start()
            committer_a = GroupCommitter(via_proxy, lease_a)
            for i in range(20):
                await committer_a.commit([f"a{i}".encode()])
                acknowledged.append(f"a{i}".encode())
            proxy.set_mode("blackhole")
            late = asyncio.create_task(committer_a.commit([b"a-late"]))

            async def a_stops() -> float:
                while keeper_a.may_acknowledge(31):
                    await asyncio.sleep(0.005)
                return time.monotonic()

            async def b_takes() -> tuple[float, object]:
                while (lease := await direct.take(31, "b")) is None:
                    await asyncio.sleep(0.005)
                return time.monotonic(), lease

            stopped, (took, lease_b) = await asyncio.gather(a_stops(), b_takes())
            assert stopped < took  # a stopped on its own before b could take over
            committer_b = GroupCommitter(direct, lease_b)
            for i in range(10):
                await committer_b.commit([f"b{i}".encode()])
                acknowledged.append(f"b{i}".encode())
            proxy.set_mode("reset")
            await asyncio.sleep(0.2)
            proxy.set_mode("pass")
            for attempt in (late, asyncio.ensure_future(committer_a.commit([b"a-after"]))):
                try:
                    await asyncio.wait_for(attempt, 10)
                except Exception as exc:  # fenced, or the reset connection
                    refused.append(type(exc).__name__)
                else:
                    raise AssertionError("a deposed primary's write was acknowledged")
            await keeper_a.stop()
            records = await direct.read(31, 0, limit=10_000)
        finally:
            await via_proxy.pool.close()
            await direct.pool.close()
        assert [r[2] for r in records] == acknowledged, records
        assert [r[0] for r in records] == list(range(1, 31))
        assert {r[1] for r in records[:20]} == {lease_a.epoch}
        assert {r[1] for r in records[20:]} == {lease_b.epoch} and lease_b.epoch > lease_a.epoch
        return refused

    try:
        refused = run(scenario())
    finally:
        proxy.close()
    assert "Fenced" in refused, refused


def test_cluster_status_shows_nodes_primaries_epochs_and_follower_lag(pg_dsn):
    from rankd.cluster.nodes import Nodes

    async def scenario():
        store = await _open(pg_dsn, lease=30)
        nodes = Nodes(store.pool, alive_seconds=0.5)
        try:
            await nodes.migrate()
            lease = await store.take(40, "a")
            await store.append(lease, 1, [b"x"] * 10)
            await nodes.heartbeat("a", "127.0.0.1:7700", {})
            await nodes.heartbeat("b", "127.0.0.1:7800", {40: 7})
            await nodes.heartbeat("c", "127.0.0.1:7900", {40: 10})
            first = await nodes.status()
            await asyncio.sleep(0.7)
            await nodes.heartbeat("a", "127.0.0.1:7700", {})
            await nodes.heartbeat("c", "127.0.0.1:7900", {40: 10})
            later = await nodes.status()
        finally:
            await store.pool.close()
        return first, later

    first, later = run(scenario())
    (group,) = [g for g in first["groups"] if g["group"] == 40]
    assert (group["epoch"], group["primary"], group["last_seq"]) == (1, "a", 10)
    assert 25 < group["lease_seconds_left"] <= 30
    assert group["followers"] == {"b": {"applied": 7, "lag": 3}, "c": {"applied": 10, "lag": 0}}
    assert [n["node"] for n in first["nodes"]] == ["a", "b", "c"]
    assert all(n["alive"] for n in first["nodes"])
    # b stopped beating: not alive by Postgres's clock, and no longer listed as a follower.
    assert {n["node"]: n["alive"] for n in later["nodes"]} == {"a": True, "b": False,
                                                              "c": True}
    (group,) = [g for g in later["groups"] if g["group"] == 40]
    assert set(group["followers"]) == {"c"}


async def _waiting_inserts(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND (query LIKE 'INSERT INTO rankd_group_snapshots%' "
        "OR query LIKE 'COPY %rankd_group_snapshots%')")


class _Recording:
    """A pool whose connections note the size of every parameter and COPY
    chunk they send (a statement's parameter is encoded in one loop step)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool, self.sizes = pool, []

    @contextlib.asynccontextmanager
    async def acquire(self, **kwargs):
        async with self.pool.acquire(**kwargs) as conn:
            yield _RecordingConnection(conn, self.sizes)


class _RecordingConnection:
    def __init__(self, conn: asyncpg.Connection, sizes: list[int]) -> None:
        self.conn, self.sizes = conn, sizes

    def __getattr__(self, name: str):
        method = getattr(self.conn, name)
        if name not in ("execute", "fetch", "fetchrow", "fetchval"):
            return method

        def noted(query, *args, **kwargs):
            self.sizes.extend(len(arg) for arg in args if isinstance(arg, bytes))
            return method(query, *args, **kwargs)
        return noted

    async def copy_to_table(self, table: str, *, source, **kwargs):
        async def noted():
            async for chunk in source:
                self.sizes.append(len(chunk))
                yield chunk
        return await self.conn.copy_to_table(table, source=noted(), **kwargs)


def test_a_large_snapshot_section_is_sent_a_piece_at_a_time(pg_dsn):
    """A board's index section runs to tens of MiB: sent as one statement
    parameter, asyncpg copied it into its buffer in one loop step (a move's
    target held its loop 40-80 ms so, storing its first snapshot).  It is
    streamed SNAPSHOT_PIECE bytes at a time; small sections go as before;
    the snapshot reads back whole, and storing it again changes nothing."""
    from rankd.cluster.log import SNAPSHOT_PIECE

    async def scenario():
        store = await _open(pg_dsn)
        try:
            lease = await store.take(4, "a")
            await store.append(lease, 1, [b"r1"])
            big = random.Random(4).randbytes(5 * SNAPSHOT_PIECE + 123)
            sections = [b"small", big, b"x" * SNAPSHOT_PIECE]
            recording = _Recording(store.pool)
            store.pool = recording
            assert await store.store_snapshot(lease, 1, lease.epoch, sections)
            assert recording.sizes and max(recording.sizes) <= SNAPSHOT_PIECE + 64
            assert sum(recording.sizes) >= len(big) + SNAPSHOT_PIECE
            assert await store.store_snapshot(lease, 1, lease.epoch, sections)  # again
            store.pool = recording.pool
            assert await store.snapshot(4) == (1, lease.epoch, sections)
            assert await store.pool.fetchval(
                "SELECT count(*) FROM rankd_group_snapshots WHERE group_id = 4") == 3
        finally:
            await store.pool.close()

    run(scenario())


def test_batches_and_snapshots_are_stored_uncompressed(pg_dsn):
    """TOAST's compression is left out of the log and the snapshots (its
    CPU on every append, and a snapshot's pieced read decompressing from
    the start for every piece): compressible batches and sections are kept
    as they came, and read back whole and in pieces.  A table made before
    (compressing) is altered at the next start."""
    async def scenario():
        store = await _open(pg_dsn)
        try:
            for altered in (False, True):
                lease = await store.take(3, "a")
                first = (await store.register(3))["last_seq"] + 1
                batch = [b"player:%012d" % i + bytes(20) for i in range(2_000)]
                await store.append(lease, first, batch)
                section = b"".join(batch) * 40  # 2.5 MiB: read in pieces
                assert await store.store_snapshot(lease, first + 1_999, lease.epoch,
                                                  [section, b"x"])
                assert await store.pool.fetchval(
                    "SELECT count(*) FROM rankd_log WHERE pg_column_compression(records) "
                    "IS NOT NULL") == 0
                assert await store.pool.fetchval(
                    "SELECT count(*) FROM rankd_group_snapshots WHERE "
                    "pg_column_compression(data) IS NOT NULL") == 0
                assert [p for _, _, p in await store.read(3, first - 1, 10_000)] == batch
                assert await store.snapshot(3) == (first + 1_999, lease.epoch, [section, b"x"])
                if not altered:  # as a table of before: compressed; a start alters it
                    async with store.pool.acquire() as conn:
                        await conn.execute(
                            "ALTER TABLE rankd_log ALTER COLUMN records SET STORAGE EXTENDED;"
                            "ALTER TABLE rankd_group_snapshots ALTER COLUMN data "
                            "SET STORAGE EXTENDED")
                        await conn.execute("INSERT INTO rankd_log VALUES (99, 1, 1, 1, $1)",
                                           section)
                        assert await conn.fetchval(
                            "SELECT pg_column_compression(records) FROM rankd_log "
                            "WHERE group_id = 99") == "pglz"
                        await conn.execute("DELETE FROM rankd_log WHERE group_id = 99")
                        await migrate(conn)
        finally:
            await store.pool.close()

    run(scenario())


def test_a_snapshot_is_copied_in_without_locking_its_group_and_can_be_cancelled(pg_dsn):
    """Storing a large snapshot takes seconds; the group's appends and
    lease renewals go on meanwhile (they wait for the register's lock).  A
    store cancelled mid-copy (a node leaving) ends at once and keeps
    nothing; one whose lease moved on keeps nothing either."""
    async def scenario():
        store = await _open(pg_dsn)
        blocker = await asyncpg.connect(pg_dsn)
        watcher = await asyncpg.connect(pg_dsn)  # outside the blocker's transaction
        try:
            lease = await store.take(5, "a")
            await store.append(lease, 1, [b"r1", b"r2", b"r3"])
            # Postgres holds the copy at its first section, as a busy disk would.
            sections = [bytes([part]) * (8 << 20) for part in range(4)]
            blocking = blocker.transaction()
            await blocking.start()
            await blocker.execute("LOCK TABLE rankd_group_snapshots IN EXCLUSIVE MODE")
            copying = asyncio.create_task(store.store_snapshot(lease, 3, 1, sections))
            deadline = time.monotonic() + 10
            while not await _waiting_inserts(watcher):
                assert time.monotonic() < deadline and not copying.done()
                await asyncio.sleep(0.02)
            assert await asyncio.wait_for(store.append(lease, 4, [b"r4"]), 2) == 4
            await asyncio.wait_for(store.renew(lease), 2)
            copying.cancel()
            done, _ = await asyncio.wait({copying}, timeout=3)
            assert copying in done and copying.cancelled()
            await blocking.rollback()
            assert await store.snapshot(5) is None

            assert await store.store_snapshot(lease, 4, 1, sections[:2]) is True
            assert await store.snapshot(5) == (4, 1, sections[:2])
            # Deposed: a snapshot of the old epoch is not kept.
            await store.pool.execute("UPDATE rankd_groups SET lease_until = now() "
                                     "WHERE group_id = 5")
            taker = await store.take(5, "b")
            assert await store.store_snapshot(lease, 4, 1, [b"stale"]) is False
            assert await store.snapshot(5) == (4, 1, sections[:2])
            await store.append(taker, 5, [b"r5", b"r6"])
            assert await store.store_snapshot(taker, 6, 2, [b"newer"]) is True
            assert await store.snapshot(5) == (6, 2, [b"newer"])
            assert await store.pool.fetchval(
                "SELECT count(*) FROM rankd_group_snapshots WHERE group_id = 5") == 1
        finally:
            await blocker.close()
            await watcher.close()
            await store.pool.close()

    run(scenario())


def test_an_append_never_waits_for_another_sessions_notification_commit(pg_cluster):
    """Postgres serialises the commits of transactions that NOTIFY (one lock
    held through the WAL flush): an append that notified inside its own
    transaction queued behind every other notifying commit, so appends to
    many groups got no group commit (bench/bench_scale.py).  Here another
    session's notifying commit is held (it waits for a synchronous standby
    that never comes) and appends must still commit; their notification
    reaches a listener once that session lets go."""
    dsn = pg_cluster.admin_dsn

    async def scenario():
        admin = await asyncpg.connect(dsn)
        await admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        await admin.execute("SELECT pg_reload_conf()")
        # The appends' sessions commit locally; only the blocker waits for the standby.
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4,
                                         server_settings={"synchronous_commit": "local"})
        async with pool.acquire() as conn:
            await migrate(conn)
            await conn.execute("CREATE TABLE elsewhere (x int)")
        store = ClusterLog(pool, lease_seconds=30)
        listener = await asyncpg.connect(dsn)
        heard: asyncio.Queue = asyncio.Queue()
        await listener.add_listener("rankd_log", lambda *args: heard.put_nowait(args[3]))
        blocker = await asyncpg.connect(dsn)
        blocker_pid = blocker.get_server_pid()
        for _ in range(100):  # (a reload reaches the sessions a moment later)
            if await blocker.fetchval("SHOW synchronous_standby_names") == "nobody":
                break
            await asyncio.sleep(0.05)
        held = asyncio.ensure_future(blocker.execute(  # (WAL written: its commit waits)
            "BEGIN; INSERT INTO elsewhere VALUES (1); SELECT pg_notify('elsewhere', 'x'); "
            "COMMIT"))
        try:
            for _ in range(100):  # until its commit waits (holding the notify lock)
                waiting = await admin.fetchval(
                    "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", blocker_pid)
                if waiting == "SyncRep":
                    break
                await asyncio.sleep(0.05)
            assert waiting == "SyncRep"
            leases = [await store.take(group, "a") for group in (3, 4)]
            for lease in leases:
                assert await asyncio.wait_for(store.append(lease, 1, [b"r1"]), 5) == 1
            assert [r[2] for r in await store.read(4, 0)] == [b"r1"]
            assert heard.empty()  # the notifications wait behind the blocker ...
        finally:
            await admin.execute("SELECT pg_cancel_backend($1)", blocker_pid)
            await asyncio.gather(held, return_exceptions=True)
            await admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await admin.execute("SELECT pg_reload_conf()")
        # ... and arrive once it committed: one per group, its last position.
        notes = set()
        while len(notes) < 2:
            notes.add(await asyncio.wait_for(heard.get(), 5))
        assert notes == {"3:1", "4:1"}
        await store.notifier.drain()
        for conn in (listener, blocker, admin):
            await conn.close()
        await pool.close()

    run(asyncio.wait_for(scenario(), 60))
