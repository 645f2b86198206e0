"""Reads of the boards: views, pages, standings, ranks, periods, digests.

Owns how a read finds its board, window, period and index
(:meth:`Queries.board`, :meth:`Queries.resolve`), and the answers built from
them.  A read never waits and changes nothing.  It is refused while the
state rolls back after a storage failure, and on a cluster node when the
node cannot answer it truthfully (``Replication.check_read``): within a
transaction's step such a refusal is noted in ``unsettled_reads`` instead,
and the transaction answers once those groups commit.  Packed plain reads
(RESP's) are answered natively by :mod:`rankd.engine.reads` from the same
boards.

May not touch: the log, the commit pipeline, snapshots.  It writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from rankd.engine import expiry
from rankd.engine.board import Board
from rankd.engine.core import Core
from rankd.engine.errors import InvalidInput, NotFound, ReadOnly, Unavailable, Unsettled
from rankd.engine.groups import group_of
from rankd.engine.ingest import check_member
from rankd.engine.periods import check_window, period_of, period_start
from rankd.engine.view import SortedView
from rankd.index.dump_body import state_body


class Queries:
    """Every read of the boards (module docstring)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.state = core.state
        #: While a transaction runs its step: the groups whose uncommitted
        #: writes its reads met (it answers once they commit), else None.
        self.unsettled_reads: set[int] | None = None

    def board(self, name: str, *, reading: bool = True) -> Board:
        """The board named ``name`` (``NotFound`` if none); ``reading``: for a
        read, which a cluster node may refuse (its group not committed or
        not fresh enough here: ``Replication.check_read``)."""
        core = self.core
        if core.plain_reads.paused:  # rolling back (see rankd.engine.failure)
            raise ReadOnly("rankd is rolling back writes its log did not keep after a "
                           "storage failure; reads resume once it is done")
        if type(name) is not str:  # a list or a map would not even hash
            raise InvalidInput("board name must be a string")
        replication = core.replication
        if replication is not None:
            if not replication.serving:
                raise Unavailable("this node is catching up with the cluster's log; it "
                                  "serves once it has (see /v1/ready)")
            if reading:
                try:
                    replication.check_read(group_of(name), name)
                except Unsettled as exc:
                    if self.unsettled_reads is None:
                        raise
                    self.unsettled_reads.add(exc.group)  # a transaction's: it waits after
        board = self.state.boards.get(name)
        if board is None or (board.expires_at is not None and self.state.expired(board)):
            raise NotFound(f"no board named {name!r}")
        return board

    def resolve(self, name: str, window: str | None, period: str | None, *,
                reading: bool = True):
        """Resolve (board, window, period, index-or-None) for a read."""
        board = self.board(name, reading=reading)
        window = window or board.config.primary_window
        try:
            check_window(window)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if window not in board.periods:
            raise NotFound(f"board {name!r} does not keep the {window!r} window")
        current = period_of(window, self.core.clock())
        if period is None or period == current:
            return board, window, current, board.index(window, current)
        try:
            period_start(window, period)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        index = board.index(window, period)
        if index is None:
            raise NotFound(f"period {period!r} of the {window} window is not retained")
        return board, window, period, index

    def view(self, name: str, window: str | None = None, period: str | None = None
             ) -> SortedView:
        """A window of the board as a sorted set in Redis's order (see
        :mod:`rankd.engine.view`)."""
        board, _, _, index = self.resolve(name, window, period)
        return SortedView(index, board.config.order == "asc")

    def read_version(self, name: str, window: str | None = None, period: str | None = None
                     ) -> tuple[int, str, str]:
        """``(version, window, period)`` a read would see: callers cache
        serialized reads by it (any write to the board bumps the version)."""
        board, window, period, _ = self.resolve(name, window, period)
        return board.version, window, period

    def top(self, name: str, *, window: str | None = None, period: str | None = None,
            offset: int = 0, limit: int = 10) -> dict[str, Any]:
        """The leaderboard page ``offset..offset+limit`` of a window."""
        board, window, period, index = self.resolve(name, window, period)
        entries = [] if index is None else index.range_by_rank(offset, limit)
        labels = board.labels
        return {
            "entries": [{"rank": rank, "member": member, "score": score + 0.0,  # -0: 0
                         "label": labels.get(member)} for rank, member, score in entries],
            "total": 0 if index is None else len(index),
            "window": window,
            "period": period,
            "version": board.version,
            "updated_at": board.updated_at,
        }

    def standing_read(self, name: str, member: str, window: str | None = None,
                      period: str | None = None) -> tuple[Board, str, str, Any]:
        """What a standing read of ``member`` reads: ``(board, window,
        period, index or None)`` as :meth:`resolve` finds them, the member
        checked (a front-end that writes the answer itself starts here)."""
        found = self.resolve(name, window, period)
        check_member(member)
        return found

    def standing(self, name: str, member: str, *, window: str | None = None,
                 period: str | None = None) -> dict[str, Any] | None:
        """A member's score and ranks in a window, or ``None`` if absent."""
        board, window, period, index = self.standing_read(name, member, window, period)
        if index is None or member not in index:
            return None
        return {
            "member": member,
            "score": index.score(member) + 0.0,  # a -0 (rankd.engine.zeros) shows as 0
            "rank": index.rank(member),
            "competition_rank": index.competition_rank(member),
            "dense_rank": index.dense_rank(member),
            "percentile": index.percentile(member),
            "total": len(index),
            "label": board.labels.get(member),
            "window": window,
            "period": period,
            "version": board.version,
        }

    def around(self, name: str, member: str, *, above: int = 4, below: int = 4,
               window: str | None = None, period: str | None = None
               ) -> list[dict[str, Any]] | None:
        """Entries around a member (included), or ``None`` if absent."""
        board, _, _, index = self.resolve(name, window, period)
        check_member(member)
        entries = None if index is None else index.around(member, above, below)
        if entries is None:
            return None
        return [{"rank": r, "member": m, "score": s + 0.0, "label": board.labels.get(m)}
                for r, m, s in entries]

    def ranks(self, name: str, members: Sequence[str], *, window: str | None = None,
              period: str | None = None) -> dict[str, Any]:
        """A friends board: the given members ordered, with global and list ranks."""
        board, window, period, index = self.resolve(name, window, period)
        for member in members:
            check_member(member)
        found = []
        missing = []
        for member in dict.fromkeys(members):
            rank = None if index is None else index.rank(member)
            if rank is None:
                missing.append(member)
            else:
                found.append((rank, member))
        found.sort()
        return {
            "entries": [{"rank": rank, "list_rank": position, "member": member,
                         "score": index.score(member) + 0.0, "label": board.labels.get(member)}
                        for position, (rank, member) in enumerate(found, 1)],
            "missing": missing,
            "window": window,
            "period": period,
        }

    def periods(self, name: str, window: str | None = None) -> dict[str, Any]:
        """The current period of a window and the closed ones retained."""
        board, window, current, _ = self.resolve(name, window, None)
        return {"window": window, "current": current,
                "retained": [p for p in board.periods[window] if p < current][::-1]}

    def board_info(self, name: str, *, reading: bool = True) -> dict[str, Any]:
        """A board's config, member counts per window and version
        (``reading`` False: as the answer of a write to it)."""
        board = self.board(name, reading=reading)
        return {"name": name,
                "config": {**board.config.to_dict(), expiry.FIELD: board.expires_at},
                "members": board.member_counts(self.core.clock()),
                "version": board.version, "updated_at": board.updated_at}

    def deadline(self, name: str) -> int | None:
        """Board ``name``'s deadline, ms since the epoch (None: none);
        ``NotFound`` if it is not shown (see :meth:`board`)."""
        return self.board(name).expires_at

    def digest(self, name: str | None = None) -> str:
        """An order-sensitive hash of boards' configs, members, scores, ranks
        and labels, to compare two states cheaply."""
        boards = self.state.boards
        digest = hashlib.blake2b(digest_size=16)
        names = sorted(boards) if name is None else [self.board(name, reading=False).name]
        for board_name in names:
            board = boards[board_name]
            digest.update(json.dumps([board_name, board.config.to_dict()]).encode())
            if board.expires_at is not None:
                digest.update(b"expires_at %d" % board.expires_at)
            for window in sorted(board.periods):
                for period, index in sorted(board.periods[window].items()):
                    digest.update(f"{window}/{period}".encode())
                    # The same bytes under either index layout (dump_body).
                    digest.update(state_body(index.dump()))
            digest.update(json.dumps(sorted(board.labels.items())).encode())
        return digest.hexdigest()
