"""A cluster group's snapshot, loaded without holding the event loop.

Owns how a node builds the boards of a group from its snapshot (a follower
the group's log no longer serves from its position, the target of a move)
and puts them in place.  Loading them in one callback held the node's
event loop for seconds on a board of a million members (the rank index's
rebuild, then every event id), so every client of the node waited, and a
move's writers with them.  Now:

1. :func:`build` runs in a worker thread: it makes new :class:`Board`
   objects, nobody else sees yet, from the sections that belong to one
   board (the board, its indexes, labels and event ids), in a scratch
   :class:`BoardState`.  The native rank indexes' loads (either kind)
   and the event ids' (in pieces of :data:`EVENT_ID_PIECE` bytes) run
   without the GIL, taking it back between runs of a few thousand
   members or entries: the loop's thread takes the GIL again for each
   uvloop callback, and a load that only let go of it now and then made
   each of them wait;
2. :func:`encoded` makes the local log's records of the snapshot, in the
   worker thread too (copies of megabytes), none over
   :data:`COMMIT_BYTES` (a larger section in pieces), and
   :func:`commit_runs` hands them to the log a run of that size per loop
   step: framing and writing a board's 25 MB index in one step held the
   loop for tens of ms;
3. on the loop, :func:`install` swaps the built boards in (one dict store
   each) and applies the sections that touch the node's shared state
   (deadlines, boards being built, positions): small, and in order.

The caller drops the group's old boards right before :func:`install`, in
the same callback, so no reader ever sees a mix; the group's records after
the snapshot wait (the log tail holds the group's lock meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgpack

from rankd.engine import records, staging
from rankd.engine.board import Board
from rankd.engine.groups import group_of
from rankd.engine.idstore import CHUNK_HEAD, PORTABLE
from rankd.engine.sections import index_dump
from rankd.engine.state import BoardState

#: Sections applied on the loop: they change state other boards share.
LOOP_KINDS = frozenset({"expiry", "positions", "walked", staging.SECTION})
#: Bytes of event ids handed to the native store at once (a ms or so).
EVENT_ID_PIECE = 64 << 10
#: Bytes of the local log's records of a snapshot committed in one pass,
#: and the most of a section one record holds (a larger one, a board's
#: index, is logged in pieces): framing and writing 8 MiB at once held the
#: loop for tens of ms, a 25 MB index section hundreds.
COMMIT_BYTES = 1 << 20


@dataclass
class Built:
    """A group's boards built off the loop, and what is left to apply on it."""

    boards: dict[str, Board] = field(default_factory=dict)
    #: Sections of :data:`LOOP_KINDS`, in snapshot order.
    later: list[bytes] = field(default_factory=list)


def build(sections: list[bytes], clock: Callable[[], float]) -> Built:
    """The boards of a group snapshot's ``sections`` (call it in a worker
    thread: it touches no state the loop sees).  Raises as
    ``BoardState.load`` does on a damaged section."""
    scratch = BoardState(clock)
    built = Built(scratch.boards)
    for payload in sections:
        if index_dump(payload) is None:
            section = records.decode(payload)
            kind = section[0]
            if kind in LOOP_KINDS:
                built.later.append(payload)
                continue
            if kind == "event_id_store":
                dedupe = scratch.boards[section[1]].dedupe
                for piece in event_id_pieces(section[2], EVENT_ID_PIECE):
                    dedupe.load_store(piece)
                continue
        scratch.load([payload])
    return built


def event_id_pieces(chunk: bytes, size: int) -> Iterator[bytes]:
    """A snapshot's chunk of event ids (``DedupeTable.log_chunks``: a head,
    then fixed-size entries) as chunks of about ``size`` bytes, each the
    head and a run of the entries, in order.  A malformed chunk is yielded
    whole, for ``load_store`` to refuse."""
    head, body = chunk[:CHUNK_HEAD.size], memoryview(chunk)[CHUNK_HEAD.size:]
    per_piece = max(1, size // PORTABLE.size) * PORTABLE.size
    if len(chunk) < CHUNK_HEAD.size or len(body) % PORTABLE.size:
        yield chunk
        return
    for start in range(0, len(body), per_piece):
        yield head + body[start:start + per_piece]


def encoded(group: int, seq: int, epoch: int, sections: list[bytes]) -> list[bytes]:
    """The local log's ``GROUP_LOAD`` records of a group snapshot (replayed
    by ``Replayer.load_group_part``), one per section, or one per piece of
    :data:`COMMIT_BYTES` of a larger section."""
    parts = sections or [None]  # a group without boards: one empty part
    # records.encode's bytes, from a packer of this thread's own (the
    # module's one is the loop thread's).
    packer = msgpack.Packer(use_bin_type=True)
    logged = []
    for part, section in enumerate(parts):
        head = [records.GROUP_LOAD, group, seq, epoch, part, len(parts)]
        if section is None or len(section) <= COMMIT_BYTES:
            logged.append(packer.pack([*head, section]))
            continue
        view = memoryview(section)
        pieces = -(-len(section) // COMMIT_BYTES)
        logged.extend(packer.pack([*head, view[start:start + COMMIT_BYTES], piece, pieces])
                      for piece, start in enumerate(range(0, len(section), COMMIT_BYTES)))
    return logged


def commit_runs(logged: list[bytes]) -> Iterator[list[bytes]]:
    """``logged`` in runs of about :data:`COMMIT_BYTES`, each appended to
    the local log in a pass of its own (one write of tens of megabytes
    would hold the loop)."""
    run: list[bytes] = []
    size = 0
    for payload in logged:
        if run and size + len(payload) > COMMIT_BYTES:
            yield run
            run, size = [], 0
        run.append(payload)
        size += len(payload)
    yield run


def install(state: BoardState, group: int, built: Built) -> set[str]:
    """Put ``built``'s boards in place (the group's old ones dropped just
    before, in the same callback) and apply its other sections; returns
    the group's board names."""
    boards = state.boards
    for name, board in built.boards.items():
        boards[name] = board
    state.load(built.later)
    return {name for name in boards if group_of(name) == group}
