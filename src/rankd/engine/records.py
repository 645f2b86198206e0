"""WAL record payloads: what the engine logs, encoded with msgpack.

Every record is a msgpack array whose first item is its kind.  A submission
records what was submitted *and* the absolute state it produced (the new
score in every window it changed, and the result it answered), so replaying
it sets state rather than re-deriving it: replay is idempotent and a
duplicate event answers exactly what it answered the first time, also after
a restart.  The arrival sequence of a change is the record's log position.

=========  ===============================================================
kind       items after the kind
=========  ===============================================================
BOARD_PUT  name, config (dict), ts_ms
BOARD_DROP name, ts_ms
SUBMIT     board, member, value, is_delta, event_id, ts_ms, now_ms, label,
           updates [[window, period, score], ...],
           result [score, rank, previous, changed]
REMOVE     board, member, ts_ms
EXPIRE     board, deadline (ms since the epoch, or None: no more), ts_ms
EXPIRED    board, deadline, ts_ms: the board is deleted, its deadline
           passed (written by whoever writes the board: see
           rankd.engine.expiry)
=========  ===============================================================

A transaction of ``n > 1`` records (``rankd.engine.transaction``) takes
``n`` positions: ``n - 1`` placeholders, then one record holding all ``n``,
applied at those positions when it is met (one frame: all or nothing):

===========  ==============================================================
kind         items after the kind
===========  ==============================================================
TX_SLOT      board, ts_ms: a position of the transaction that follows
TRANSACTION  board, first, payloads, ts_ms: the records (each encoded) at
             positions first, first + 1, ... (this one's is the last)
===========  ==============================================================

A cluster node (``--cluster-dsn``) logs every record of a board group
wrapped with its place in the group's log, and nothing else:

============  ============================================================
kind          items after the kind
============  ============================================================
REPLICATED    group, first_seq, epoch, payloads: records above (each
              encoded) at positions first_seq, first_seq + 1, ...
GROUP_RESET   group: the group's boards are gone (it is replayed again from
              the cluster's log)
GROUP_LOAD    group, seq, epoch, part, parts, section[, piece, pieces]: part
              ``part`` of ``parts`` of the group's state at ``seq`` (its
              snapshot in the cluster, as snapshot sections); part 0 drops
              the group's boards.  With ``piece``, ``section`` is piece
              ``piece`` of ``pieces`` of the part's section, in order in
              consecutive records (a large section is logged in pieces:
              ``rankd.engine.group_load``)
============  ============================================================

A board built in steps (a large store: ``rankd.engine.staging``) is logged
as parts, then one record that swaps it in; parts without it change
nothing visible:

===========  ==============================================================
kind         items after the kind
===========  ==============================================================
STORE_PART   board, store, config, members, scores, ts_ms
STORE_DONE   board, store, config, parts, ts_ms
STORE_DROP   board, store, ts_ms
===========  ==============================================================
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgpack

BOARD_PUT = 1
BOARD_DROP = 2
SUBMIT = 3
REMOVE = 4
REPLICATED = 5
GROUP_RESET = 6
GROUP_LOAD = 7
TX_SLOT = 8
TRANSACTION = 9
EXPIRE = 10
EXPIRED = 11

KIND_NAMES = {BOARD_PUT: "board_put", BOARD_DROP: "board_drop", SUBMIT: "submit",
              REMOVE: "remove", REPLICATED: "replicated", GROUP_RESET: "group_reset",
              GROUP_LOAD: "group_load", TX_SLOT: "tx_slot", TRANSACTION: "transaction",
              EXPIRE: "expire", EXPIRED: "expired"}

# A board built in steps (numbered apart, for kinds to come in between).
STORE_PART = 20
STORE_DONE = 21
STORE_DROP = 22
KIND_NAMES.update({STORE_PART: "store_part", STORE_DONE: "store_done",
                   STORE_DROP: "store_drop"})

_packer = msgpack.Packer(use_bin_type=True)


#: A record bigger than this gets the packer replaced: its buffer keeps the
#: size of the biggest record it ever packed, for the life of the process.
#: msgpack's buffer starts at 256 KiB and grows only past it (at 1 MiB, a
#: snapshot's last event-id section of 0.3 to 1 MiB left a 1.8 MiB buffer).
_PACKER_KEEPS = 256 << 10


def encode(record: tuple | list) -> bytes:
    """Encode one record."""
    global _packer
    payload = _packer.pack(record)
    if len(payload) > _PACKER_KEEPS:
        _packer = msgpack.Packer(use_bin_type=True)
    return payload


def decode(payload: bytes) -> tuple:
    """Decode one record (arrays come back as tuples)."""
    return msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)


def describe(payload: bytes) -> dict[str, Any]:
    """Columns for the Postgres event history: kind, board, member, value, time."""
    record = decode(payload)
    kind = record[0]
    columns: dict[str, Any] = {"kind": KIND_NAMES.get(kind, str(kind)), "board": record[1]}
    if kind == SUBMIT:
        columns["member"] = record[2]
        columns["value"] = float(record[3])
        columns["event_ts"] = datetime.fromtimestamp(record[6] / 1000, UTC)
    elif kind == REMOVE:
        columns["member"] = record[2]
        columns["event_ts"] = datetime.fromtimestamp(record[3] / 1000, UTC)
    else:
        columns["event_ts"] = datetime.fromtimestamp(record[-1] / 1000, UTC)
    return columns
