"""Which hash slot, and which board group, a board belongs to.

A board's *slot* is Redis Cluster's: ``CRC16(key) % SLOTS`` (:data:`SLOTS`
is 16384; CRC16 is XMODEM's, the one Redis's cluster spec names, which
``binascii.crc_hqx(data, 0)`` computes), of only the key's hash tag when it
has a non-empty one.  Slots fall into :data:`GROUPS` *board groups* of
:data:`SLOTS_PER_GROUP` contiguous slots (``group = slot // 16``); in a
cluster each group has its own log and at most one primary at a time, so a
group can move, or live on any subset of the nodes, without touching the
others, and a Redis Cluster client sees each group as a slot range.

Clusters made before hash slots grouped boards by CRC-32 instead
(:func:`legacy_group_of`, kept only so ``rankd cluster migrate-slots`` can
read such a cluster; the scheme a cluster uses is recorded in Postgres, see
:mod:`rankd.cluster.scheme`).

The engine owns it (its writes are routed and logged by group, and
transactions stay within one); :mod:`rankd.cluster.groups` takes it from
here, since the cluster is built on the engine, never the reverse.  This
module imports nothing of rankd's.
"""

from __future__ import annotations

import zlib
from binascii import crc_hqx

#: Redis Cluster's number of hash slots.
SLOTS = 16384
#: The number of board groups: fixed for the life of a cluster.
GROUPS = 1024
#: Contiguous slots per group (group ``g`` is slots ``16g .. 16g + 15``).
SLOTS_PER_GROUP = SLOTS // GROUPS
#: The name of this grouping scheme, as recorded in a cluster's Postgres.
SCHEME = "crc16-slots"


def hash_tag(key: str) -> str:
    """The part of ``key`` that is hashed: the text between its first ``{``
    and the first ``}`` after it when not empty, else the whole key (Redis
    Cluster's rule)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def slot_of(key: str | bytes) -> int:
    """The hash slot of ``key`` (``CLUSTER KEYSLOT``): ``crc16(tag) % 16384``
    of its UTF-8 bytes.  So ``{cup}:daily`` and ``{cup}:weekly`` share one."""
    if isinstance(key, bytes):
        start = key.find(b"{")
        if start >= 0:
            end = key.find(b"}", start + 1)
            if end > start + 1:
                key = key[start + 1:end]
        return crc_hqx(key, 0) & (SLOTS - 1)
    return crc_hqx(hash_tag(key).encode(), 0) & (SLOTS - 1)


def group_of(board: str) -> int:
    """The group of ``board``: its slot's range, ``slot_of(board) // 16``."""
    return (crc_hqx(hash_tag(board).encode(), 0) & (SLOTS - 1)) // SLOTS_PER_GROUP


def slots_of_group(group: int) -> range:
    """The slots group ``group`` covers."""
    return range(group * SLOTS_PER_GROUP, (group + 1) * SLOTS_PER_GROUP)


def legacy_group_of(board: str) -> int:
    """The group clusters of before hash slots gave ``board``:
    ``crc32(utf8(tag)) % GROUPS`` (zlib's CRC-32).  Only to read such a
    cluster's logs while migrating it."""
    return zlib.crc32(hash_tag(board).encode()) % GROUPS
