"""The fuzz targets, one module per parser.

Each module has ``INSTRUMENT`` (the modules atheris instruments for
coverage), ``MAX_LEN`` (the longest input tried) and ``load()``, which
imports what it tests and returns the function run on each input: it raises
(an ``AssertionError`` for a broken property) on a defect.  Inputs are
plain bytes, read without atheris, so the corpus replays without it.
"""

from __future__ import annotations

import random

#: Target name -> module in this package.
TARGETS = {
    "resp": "resp_reader",
    "tcp": "tcp_decoder",
    "wal": "wal_frames",
    "live": "live_message",
    "rest": "rest_json",
    "relay": "relay_reply",
}


def split(data: bytes) -> tuple[int, int, bytes]:
    """An input's first two bytes (a mode and a chunking seed) and the rest."""
    if len(data) < 2:
        return 0, 0, data
    return data[0], data[1], data[2:]


def chunks(stream: bytes, seed: int) -> list[bytes]:
    """``stream`` cut as reads of a socket might cut it: seed 0 in one
    piece, else in pieces of 1 to ``seed`` bytes."""
    if seed == 0 or not stream:
        return [stream]
    rng = random.Random(seed)
    pieces, position = [], 0
    while position < len(stream):
        size = rng.randint(1, seed)
        pieces.append(stream[position:position + size])
        position += size
    return pieces
