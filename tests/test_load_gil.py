"""Loads a node runs in a worker thread leave the GIL to the event loop.

A node that takes a board group (a move's target) builds the group's rank
indexes and event-id stores in a worker thread (``engine/group_load.py``).
The event loop's thread takes the GIL again for each of uvloop's
callbacks, so a load that holds the GIL most of the time, even letting go
of it now and then, makes every callback wait: the native loads now do
their work without it.  Here the main thread, standing for the loop, lets
go of the GIL and takes it again (``time.sleep(0)``) over and over while a
worker thread loads; while the load held the GIL, most of those round trips
waited for it (65-73 % of them, and a whole event-id chunk's load in one),
against a few percent now.  The paged index's load, holding the GIL from
its first record to its last, was a single round trip: few trips, so few
that waited, but the longest one was nearly the whole load; now each
waits at most a run of records.  The bounds are generous on both sides.

Also: what the loads do stays the same where records or entries leave the
fast path (a record cut between pieces, a damaged one, a wide answer).
"""

from __future__ import annotations

import gc
import statistics
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

import pytest

from rankd.engine import idstore

skiplist = pytest.importorskip("rankd._skiplist")
pages = pytest.importorskip("rankd._pages")
_idstore = pytest.importorskip("rankd.engine._idstore")

MEMBERS = 200_000
#: A round trip this much over an idle one waited for the GIL.
WAITED = 0.0001
#: At most this share of round trips may wait (65-73 % while the GIL was held).
MOST_WAITING = 0.3
#: The longest round trip is at most this share of the load's wall time
#: (the paged index's load, holding the GIL, was 0.8-1.0 of it in one).
LONGEST = 0.3


class Trips(NamedTuple):
    """The main thread's GIL round trips while a worker thread loaded."""

    share: float    # of them that waited for the GIL
    count: int
    longest: float  # the longest, as a share of the load's wall time


def waiting_share(load: Callable[[], object]) -> Trips:
    """This thread's GIL round trips while a worker thread ran ``load``."""
    idle = []
    for _ in range(200):
        began = time.perf_counter()
        time.sleep(0)
        idle.append(time.perf_counter() - began)
    usual = statistics.median(idle)
    done = threading.Event()
    failed: list[BaseException] = []

    def work() -> None:
        try:
            load()
        except BaseException as exc:  # (re-raised below, in the test's thread)
            failed.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=work)
    trips = []
    # (the GIL may be taken from this thread between round trips too: the
    # longest wait is the longest gap between two of them)
    longest = 0.0
    started = last = time.perf_counter()
    worker.start()
    while not done.is_set():
        began = time.perf_counter()
        time.sleep(0)
        ended = time.perf_counter()
        trips.append(ended - began)
        longest = max(longest, ended - last)
        last = ended
    worker.join()
    wall = time.perf_counter() - started
    if failed:
        raise failed[0]
    return Trips(sum(trip > usual + WAITED for trip in trips) / max(1, len(trips)), len(trips),
                 longest / wall)


#: Both native kinds of rank index (``rankd.index.kinds``).
KINDS = [pytest.param(skiplist.RankIndex, id="skiplist"), pytest.param(pages.RankIndex, id="pages")]


def index_of(members: int, cls: type = skiplist.RankIndex, tie_break: str = "first"):
    index = cls("desc", tie_break)
    for n in range(members):
        index.set(f"member-{n}", float(n % 1000))
    return index


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize("tie_break", ["first", "member"])
def test_a_rank_index_loads_without_holding_the_gil(cls: type, tie_break: str) -> None:
    dump = index_of(MEMBERS, cls, tie_break).dump()
    shares = [waiting_share(lambda: cls.load(dump)) for _ in range(3)]
    assert min(trips.share for trips in shares) < MOST_WAITING, shares
    # A load holding the GIL throughout is one round trip: few trips, so
    # few that waited, but the loop's thread waited for all of it.
    assert min(trips.longest for trips in shares) < LONGEST, shares


def test_event_ids_load_without_holding_the_gil() -> None:
    ids = _idstore.FingerprintLog()
    for n in range(MEMBERS):
        ids.put(f"event-{n}", 1e12, f"member-{n}", n, (float(n % 1000), n, None, True))
    chunk = b"".join(ids.log_chunks(1 << 30))
    shares = [waiting_share(lambda: _idstore.FingerprintLog().load_log(chunk))
              for _ in range(3)]
    # (holding the GIL throughout, it let this thread take it once or twice)
    assert min((trips.share for trips in shares if trips.count >= 50),
               default=1.0) < MOST_WAITING, shares


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize("tie_break", ["first", "member"])
def test_a_load_in_pieces_cut_anywhere_equals_the_index(cls: type, tie_break: str) -> None:
    index = index_of(10_000, cls, tie_break)
    dump = index.dump()
    for size in (1, 7, 4096, 65_537):
        pieces = [dump[start:start + size] for start in range(0, len(dump), size)]
        loaded = cls.load_chunks(pieces, len(dump))
        assert loaded.dump() == dump
        loaded._check()


@pytest.mark.parametrize("cls", KINDS)
@pytest.mark.parametrize(("damage", "error"), [
    ("repeat", "repeats a member at record 3000"),
    ("order", "out of order at record 3000"),
    ("utf8", "not UTF-8 at record 3000"),
])
def test_a_damaged_record_past_the_first_run_is_refused_by_its_number(cls: type, damage: str,
                                                                      error: str) -> None:
    """Records 0-2047 load in a run without the GIL; record 3000, in the
    second, is refused as it always was."""
    index = cls("desc")
    for n in range(4000):
        index.set(f"m{n:05d}", float(4000 - n))  # record n: m{n}
    records = bytearray(index.dump()[:-4])  # (the checksum is checked last)
    header, width = 24, 8 + 8 + 2 + 6  # score, seq, length, then the member
    at = header + 3000 * width
    assert records[at + width - 6:at + width] == b"m03000"
    if damage == "order":
        records[at:at + 8] = struct.pack("<d", 5000.0)
    else:
        records[at + width - 6:at + width] = b"m00001" if damage == "repeat" else b"m0\xff000"
    dump = bytes(records) + struct.pack("<I", zlib.crc32(records))
    gc.collect()  # (indexes earlier tests left to the collector: counted before only)
    live = live_counts(cls)
    with pytest.raises(ValueError, match=error):
        cls.load(dump)
    gc.collect()
    assert live_counts(cls) == live  # nothing half-built is left


def live_counts(cls: type) -> tuple[int, ...]:
    """The nodes, or pages and names, every index of ``cls``'s kind holds."""
    if cls is pages.RankIndex:
        return pages.live_pages(), pages.live_names()
    return (skiplist.live_nodes(),)


@pytest.mark.parametrize("store", [_idstore.FingerprintLog, idstore.FingerprintDict])
def test_a_chunk_of_plain_and_wide_answers_loads_as_they_were(store) -> None:
    """Wide answers (and a table growing) leave the run without the GIL:
    the loaded table holds what the chunk held, in order."""
    table = store()
    for n in range(20_000):
        answer = ((1e300, 5_000_000_000, 3.0, True) if n % 997 == 0
                  else (float(n % 50), n, None, n % 2 == 0))
        table.put(f"event-{n % 15_000}", 1e12 + n, f"member-{n}", n, answer)
    other = store()
    for chunk in table.log_chunks(64 << 10):
        other.load_log(chunk)
    # (each block of records keeps one expiry time: not compared)
    assert ([(*entry[:3], entry[4]) for entry in other.items()]
            == [(*entry[:3], entry[4]) for entry in table.items()])
    assert len(other) == len(table) == 15_000
