"""A rank index's dump reduced to the state it holds, whichever layout
wrote it: what the state digest (``rankd.engine.queries``) hashes.

The layouts dump a board tied by member differently (the paged index
writes version 2, without arrival sequences; the skip list and the
pure-Python index version 1, with them: see ``_contract``).  Such a board's
order never reads a seq, so its seqs are no part of its state: the body of
a version 1 dump of one is given without them, as version 2 writes it.
"""

from __future__ import annotations

from rankd.index._contract import DUMP_HEADER, DUMP_RECORD, DUMP_TRAILER, DUMP_VERSION

_TIE_BREAK = 6  # the header's tie-break byte (0: by arrival)


def state_body(dump: bytes) -> bytes:
    """``dump``'s records without header and trailer (the header holds
    next_seq, an artefact of history), in version 2's form for a board
    tied by member."""
    view = memoryview(dump)
    body = view[DUMP_HEADER.size:len(view) - DUMP_TRAILER.size]
    if view[4] != DUMP_VERSION or view[_TIE_BREAK] == 0:
        return bytes(body)
    pieces = []
    at, end = 0, len(body)
    while at < end:
        length = int.from_bytes(body[at + 16:at + 18], "little")
        # score | member length, member: the record without its seq
        pieces.append(body[at:at + 8])
        pieces.append(body[at + 16:at + DUMP_RECORD.size + length])
        at += DUMP_RECORD.size + length
    return b"".join(pieces)
