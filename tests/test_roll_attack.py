"""Attacks on the skip list's clock-paced relayout and the write-ahead
log's segment roll off the event loop: each test is named for the defect
it exposes."""

from __future__ import annotations

import random
import statistics
import time

import pytest

skiplist = pytest.importorskip("rankd._skiplist")
from rankd.index.packed import pack_state  # noqa: E402

BOARD = 1_000_000
#: A pace close to what a move costs on a big board (a node copied, its
#: links and hash slot repointed: cache misses), so that the share of the
#: write's time a relayout takes shows.
PACE_NS = 200


def _board(*, relayout: bool) -> object:
    index = skiplist.RankIndex()
    if relayout:
        index._growth_knobs(32768, 256, pace_ns=PACE_NS)
    else:
        index._growth_knobs(1 << 40, 256)  # (never relaid out)
    rng = random.Random(7)
    run = bytearray()
    for i in range(BOARD):
        pack_state(run, f"m{i}", rng.random(), i + 1)
    index.set_states_packed(run)
    return index


def _batch(tag: str, count: int, seq: int) -> bytearray:
    rng = random.Random(tag)
    run = bytearray()
    for j in range(count):
        pack_state(run, f"{tag}-{j}", rng.random(), seq + j)
    return run


def _cpu_ms(index, run: bytearray) -> float:
    started = time.process_time()
    index.set_states_packed(run)
    return (time.process_time() - started) * 1e3


def test_relayout_credit_earned_by_its_own_moves_holds_a_batch_for_long():
    """The credit grows with wall time, and the time a step spends moving
    nodes counts too: once a move costs about the pace, each step earns the
    next one and every write of a run moves the most it may (256 nodes),
    so a run of new members applied at once during a relayout costs many
    times what it costs on a board not being relaid out."""
    relaid, plain = _board(relayout=True), _board(relayout=False)
    relaid.set("start", 0.5)  # a relayout begins (every node was placed at random)
    assert relaid._relaying
    during, without = [], []
    seq = BOARD + 10
    for rep in range(3):
        if not relaid._relaying:
            break
        during.append(_cpu_ms(relaid, _batch(f"a{rep}", 500, seq)))
        without.append(_cpu_ms(plain, _batch(f"b{rep}", 500, seq)))
        seq += 1000
    ratio = statistics.median(during) / statistics.median(without)
    assert ratio < 4, (f"500 new members: {statistics.median(during):.1f} ms of CPU during a "
                       f"relayout, {statistics.median(without):.1f} ms without ({ratio:.1f}x)")
