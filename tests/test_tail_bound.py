"""The bound on the WAL tail a crash leaves: snapshots by log records or
bytes since the last one, whichever first, and settings that cannot
exceed the documented bound."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import FakeClock, engine_config, run, sub
from rankd.cli import build_parser
from rankd.config import ConfigError, resolve
from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.tail import MAX_SNAPSHOT_EVERY_BYTES, MAX_SNAPSHOT_EVERY_EVENTS


def load_config(argv: list[str], env: dict[str, str]):
    """The daemon's settings from flags and an environment."""
    return resolve(build_parser().parse_args(["serve", *argv]), env)


@pytest.mark.parametrize("option,value", [
    ("snapshot_every_events", MAX_SNAPSHOT_EVERY_EVENTS + 1),
    ("snapshot_every_events", 0),
    ("snapshot_every_bytes", MAX_SNAPSHOT_EVERY_BYTES + 1),
    ("snapshot_every_bytes", 100),
])
def test_triggers_beyond_the_bound_are_refused(tmp_path, option, value):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError, match=flag):
        load_config(["--data-dir", str(tmp_path), flag, str(value)], env={})
    with pytest.raises(ValueError, match=option):
        EngineConfig(data_dir=tmp_path, **{option: value})
    assert not any(tmp_path.iterdir())  # nothing was made


def test_the_bound_itself_is_accepted(tmp_path):
    config = load_config(["--data-dir", str(tmp_path), "--snapshot-every-events",
                          str(MAX_SNAPSHOT_EVERY_EVENTS), "--snapshot-every-bytes",
                          str(MAX_SNAPSHOT_EVERY_BYTES)], env={})
    engine = config.engine_config()
    assert engine.snapshot_every_events == MAX_SNAPSHOT_EVERY_EVENTS
    assert engine.snapshot_every_bytes == MAX_SNAPSHOT_EVERY_BYTES


def big_submissions(start: int, end: int) -> list:
    """Submissions of about 200 bytes of log each."""
    return [sub("b", f"member-{n}", delta=1, label="x" * 64, event_id=f"event-{n:060d}")
            for n in range(start, end)]


async def settle(engine: Engine) -> None:
    """Let the snapshot loop take a snapshot that is due."""
    for _ in range(400):
        await asyncio.sleep(0.005)
        if not engine._snapshot_wanted.is_set() and not engine._snapshot_lock.locked():
            return


def test_a_snapshot_fires_on_log_bytes_before_the_record_count(tmp_path):
    """Big records reach --snapshot-every-bytes long before
    --snapshot-every-events."""
    async def scenario() -> tuple[int, dict | None, int, dict]:
        engine = await Engine.open(engine_config(
            tmp_path, snapshot_every_events=1_000_000, snapshot_every_bytes=8192),
            clock=FakeClock())
        try:
            await engine.put_board("b", {"policy": "sum"})
            await engine.submit_many(big_submissions(0, 20))
            await settle(engine)
            logged, before = engine.wal.stats.bytes, engine.last_snapshot
            await engine.submit_many(big_submissions(20, 60))
            await settle(engine)
            return logged, before, engine.wal.stats.bytes, dict(engine.last_snapshot)
        finally:
            await engine.close(snapshot=False)

    logged, before, logged_after, after = run(scenario())
    assert logged < 8192 and not before
    assert logged_after >= 8192 and after["lsn"] == 61


def test_a_restart_counts_the_replayed_tail_towards_the_next_snapshot(tmp_path):
    """After a crash, the tail replayed counts (records and bytes): a tail
    already past the trigger is snapshotted soon, not after another one."""
    async def scenario() -> tuple[int, dict | None]:
        config = engine_config(tmp_path, snapshot_every_events=1_000_000,
                               snapshot_every_bytes=8192)
        engine = await Engine.open(config, clock=FakeClock())
        await engine.put_board("b", {"policy": "sum"})
        # Past the bytes trigger before the loop can act: the "crash" comes first.
        engine._snapshot_wanted.set = lambda: None
        for start in range(0, 80, 20):
            await engine.submit_many(big_submissions(start, start + 20))
        await engine.close(snapshot=False)
        engine = await Engine.open(config, clock=FakeClock())
        try:
            tail = engine._commits.tail_bytes.since(engine.wal.stats.bytes)
            engine._snapshot_wanted.set()  # what the loop's 5 s timeout would do
            await settle(engine)
            return tail, engine.last_snapshot
        finally:
            await engine.close(snapshot=False)

    tail, snapshot = run(scenario())
    assert tail > 8192
    assert snapshot is not None and snapshot["lsn"] == 81
