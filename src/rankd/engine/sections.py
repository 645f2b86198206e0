"""Snapshot sections that end in one large blob, written as parts.

Owns the encoding of a section whose last field is a big ``bytes`` value
(an index's ``dump()``: tens of megabytes per million members) so that the
blob is never copied.  Encoded whole by :func:`rankd.engine.records.encode`,
such a section cost three copies of the board's dump at once (the dump, the
msgpack packer's buffer, which doubles as it grows and kept that size for
the life of the process, and the encoded ``bytes``): the daemon held about
35 bytes per member more after its first snapshot than before, and its
snapshot peak was a third above its live memory.

:func:`blob_section` gives the msgpack prefix (array header, the leading
fields, the blob's ``bin`` header) and the blob itself; written one after
the other (``SnapshotWriter.add_parts``) they are byte for byte what
``records.encode`` makes of the same list, so readers do not change.  An
index's dump is not even made whole: it is walked (``dump_walk``: its
size is known only once the walk ends) and written after
:func:`walked_prefix`, whose size is put in at the end
(``SnapshotWriter.walked``), and a restart reads the section back in
pieces into ``load_chunks`` (:func:`index_head` reads the leading fields
from its first piece).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

_BIN8, _BIN16, _BIN32 = b"\xc4", b"\xc5", b"\xc6"
_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")


def bin_header(size: int) -> bytes:
    """The msgpack ``bin`` header of a ``size``-byte value."""
    if size < 0x100:
        return _BIN8 + bytes((size,))
    if size < 0x10000:
        return _BIN16 + _U16.pack(size)
    if size < 0x100000000:
        return _BIN32 + _U32.pack(size)
    raise ValueError(f"a msgpack bin holds at most 4 GiB - 1 bytes, got {size}")


def blob_section(head: Sequence[Any], blob: bytes) -> tuple[bytes, bytes]:
    """``(prefix, blob)``: written in turn, the msgpack encoding of
    ``[*head, blob]`` (``head``'s fields are small: they go through a fresh
    packer, whose buffer goes with it)."""
    return blob_prefix(head, len(blob)), blob


def walked_prefix(head: Sequence[Any], size: int = 0) -> bytes:
    """:func:`blob_prefix` with a ``bin 32`` header whatever ``size``: the
    same length before a walked dump's size is known and after (a walked
    section's prefix is written first and its size put in at the end)."""
    prefix = blob_prefix(head, 0)
    return prefix[:-2] + _BIN32 + _U32.pack(size)  # (bin 8 of 0: two bytes)


def blob_prefix(head: Sequence[Any], size: int) -> bytes:
    """What :func:`blob_section` writes before a blob of ``size`` bytes."""
    packer = msgpack.Packer(use_bin_type=True)
    prefix = [packer.pack_array_header(len(head) + 1)]
    prefix += [packer.pack(field) for field in head]
    prefix.append(bin_header(size))
    return b"".join(prefix)


#: How far into a section its leading fields must end for :func:`index_dump`
#: to read it without a copy (a board name and two window/period ids).
_PREFIX_LIMIT = 4096
_INDEX_HEAD = b"\x95\xa5index"  # fixarray of 5, then the fixstr "index"


def index_dump(payload: bytes | memoryview) -> tuple[str, str, str, memoryview] | None:
    """``(board, window, period, dump)`` of an ``index`` section, the dump a
    view of ``payload`` (``RankIndex.load`` reads any buffer: decoded whole,
    msgpack would copy it); ``None`` for any other section, or one this
    cannot read in place (the caller then decodes it whole)."""
    view = memoryview(payload)
    head = index_head(view, len(view))
    if head is None:
        return None
    board, window, period, start = head
    return board, window, period, view[start:]


def index_head(first: bytes | memoryview, size: int) -> tuple[str, str, str, int] | None:
    """``(board, window, period, offset)`` of an ``index`` section of
    ``size`` bytes from its ``first`` bytes (``_PREFIX_LIMIT`` of them are
    enough), its dump starting at ``offset``; ``None`` as :func:`index_dump`."""
    view = memoryview(first)
    if view[:len(_INDEX_HEAD)] != _INDEX_HEAD:
        return None
    # (A default Unpacker allocates a 1 MiB buffer: more than a piece.)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_PREFIX_LIMIT)
    unpacker.feed(view[len(_INDEX_HEAD):_PREFIX_LIMIT])
    try:
        board, window, period = unpacker.unpack(), unpacker.unpack(), unpacker.unpack()
    except msgpack.OutOfData:
        return None
    if not all(type(field) is str for field in (board, window, period)):
        return None
    offset = len(_INDEX_HEAD) + unpacker.tell()
    tag = bytes(view[offset:offset + 1])
    width = {_BIN8: 1, _BIN16: 2, _BIN32: 4}.get(tag)
    if width is None:
        return None
    start = offset + 1 + width
    if start + int.from_bytes(view[offset + 1:start], "big") != size:
        return None
    return board, window, period, start
