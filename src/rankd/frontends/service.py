"""The operations every front-end offers, in one place.

REST and the TCP protocol both decode a request into an operation name and
typed arguments and call :class:`Service`; the service checks the
arguments (ranges, sizes, unknown fields), calls the engine and returns
plain data.  Each front-end then only encodes: JSON and HTTP statuses for
REST, msgpack frames for TCP.  So an operation behaves the same whichever
way it arrives, and its limits are defined once.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson

from rankd._native import native_or
from rankd.engine import zeros
from rankd.engine.config import BoardConfig
from rankd.engine.engine import Engine
from rankd.engine.errors import EngineError, InvalidInput, NotFound
from rankd.engine.staging import Staging
from rankd.engine.submission import Submission
from rankd.engine.view import SortedView
from rankd.security import signing

MAX_BATCH = 10_000
MAX_RANKS_MEMBERS = 1000
MAX_LIMIT = 1000
MAX_AROUND = 100
MAX_OFFSET = 2**31
#: Encoded top pages kept, least recently used first out.  Bounded by bytes:
#: bounded by entries, 2,000 reads of 1,000-entry pages once took 600 MB.
TOP_CACHE_BYTES = 64 << 20


class ByteBoundedCache:
    """A least-recently-used map of encoded answers, at most ``max_bytes``
    of them (a value larger than an eighth of that is not kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: collections.OrderedDict[tuple, tuple[int, bytes]] = \
            collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> tuple[int, bytes] | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple, version: int, data: bytes) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old[1])
        if len(data) > self.max_bytes // 8:
            return
        self._entries[key] = (version, data)
        self.bytes += len(data)
        while self.bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= len(evicted)


class TooLarge(EngineError):
    """A request beyond a size limit (HTTP 413)."""

    code = "too_large"


def integer(value: object, name: str, low: int, high: int) -> int:
    """``value`` as an int in ``low..high``, else ``InvalidInput`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}, got {value}")
    return value


def optional_text(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{name} must be a non-empty string")
    return value


#: How long a read with ``min_seq`` waits for this node to apply it.
READ_WAIT_SECONDS = 5.0
#: A plain JSON submission's body as a packed run of one, and the ``then``
#: that answers it (``rankd.frontends._rest``); None where it is not built.
pack_json, _ = native_or("rankd.frontends._rest", "pack", None)
answered_json, _ = native_or("rankd.frontends._rest", "answered", None)
#: A member's standing as the JSON bytes of its answer, natively
#: (``rankd.frontends._rest_reads``); None where it is not built.
standing_json, _ = native_or("rankd.frontends._rest_reads", "standing_json", None)


class Service:
    """Front-end operations over one engine."""

    def __init__(self, engine: Engine, *, signing_secret: str | None = None) -> None:
        self.engine = engine
        #: Whether the packed path may take a run (``Intake.takes``: not for
        #: boards that take only signed submissions, nor for another cluster
        #: node's) and its hand-over (``Engine.submit_packed_then``), bound
        #: once: a front-end calls them for every packed run it reads.
        self.takes_packed = engine.intake.takes
        self.submit_packed_then = engine.intake.submit_then
        #: RESP replies to packed plain reads (``Engine.plain_reads``).
        self.plain_reads = engine.plain_reads
        #: Verifies submissions to boards configured ``"signed": true``.
        self.signing_secret = signing_secret
        #: (board, window, period, offset, limit) -> (board version, JSON bytes)
        self._top_cache = ByteBoundedCache(TOP_CACHE_BYTES)
        #: Whether every listener of the process is up: the daemon clears it
        #: until its last listener (TCP) accepts; embedded uses leave it set.
        self.listening = True
        #: On a cluster node, its ``rankd.cluster.node.ClusterNode`` (status).
        self.cluster: Any = None
        #: On a cluster node, which node serves each group
        #: (``rankd.cluster.topology.Topology``): what front-ends route by.
        self.topology: Any = None

    # --- boards -------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {"status": "ok" if self.engine.ready else "recovering"}

    def list_boards(self, *, limit: int = MAX_LIMIT, after: str | None = None
                    ) -> dict[str, Any]:
        """Boards by name, ``limit`` at a time after the name ``after``;
        ``next`` is the ``after`` of the next page (None on the last)."""
        limit = integer(limit, "limit", 1, MAX_LIMIT)
        after = optional_text(after, "after")
        names = self.engine.live_names()
        start = 0 if after is None else bisect.bisect_right(names, after)
        page = names[start:start + limit]
        more = start + limit < len(names)
        return {"boards": [self.engine.board_info(name) for name in page],
                "next": page[-1] if more else None}

    def has_board(self, board: str) -> bool:
        """Whether board ``board`` exists (and its deadline has not passed)."""
        return self.engine.live_board(board) is not None

    def board_names(self) -> list[str]:
        """Every board's name (but those past their deadline), sorted."""
        return self.engine.live_names()

    def board_config(self, board: str) -> BoardConfig | None:
        known = self.engine.live_board(board)
        return None if known is None else known.config

    def deadline(self, board: str) -> int | None:
        """When board ``board`` is deleted, ms since the epoch (None: never);
        ``NotFound`` if there is no such board."""
        return self.engine.deadline(board)

    async def expire(self, board: str, deadline: int | None, condition: int = 0) -> bool:
        """Set or clear a board's deadline; see ``Engine.expire``."""
        return await self.engine.expire(board, deadline, condition)

    def get_board(self, board: str) -> dict[str, Any]:
        return self.engine.board_info(board)

    async def put_board(self, board: str, config: object, *, discard: object = False,
                        patch: bool = False) -> tuple[dict[str, Any], bool]:
        """``(board info, created)``; see :meth:`Engine.put_board`."""
        if not isinstance(discard, bool):
            raise InvalidInput("discard must be true or false")
        _, created = await self.engine.put_board(board, config, discard=discard, patch=patch)
        return self.engine.board_info(board, reading=False), created

    async def delete_board(self, board: str) -> None:
        await self.engine.delete_board(board)

    # --- writes -----------------------------------------------------------------------

    async def caught_up(self, board: str, seq: int) -> None:
        """Return once this node applied ``board``'s group up to ``seq``
        (read-your-writes on a cluster; ``Unavailable`` after 5 s)."""
        await self.engine.caught_up(board, seq, READ_WAIT_SECONDS)

    async def route_write(self, board: str) -> None:
        """``NotPrimary`` if another cluster node writes ``board`` (see
        ``Engine.route``)."""
        await self.engine.route(board)

    def submit(self, board: str, event: object) -> Awaitable[dict[str, Any]]:
        """The engine's answer to ``event``, once applied (raises EngineError;
        a bad event before anything is awaited).  Not a coroutine of its own:
        a frame less for every REST submission to resume."""
        return self.engine.submit(Submission.from_dict(board, self._checked(board, event)))

    def submit_json(self, board: str, body: bytes) -> asyncio.Future[dict[str, Any]] | None:
        """The answer to the JSON ``body`` of one submission to ``board``, to
        await, if it is plain and the engine's packed path takes it (natively
        read and applied with the pass's other packed runs: what
        :meth:`submit` answers, at a fraction of the cost); else None, and
        the caller decodes the body and calls :meth:`submit`."""
        packed = self.pack_plain(board, body)
        if packed is None:
            return None
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.submit_packed_then(packed, answered_json, (future, packed))
        return future

    def pack_plain(self, board: str, body: bytes) -> Any | None:
        """The JSON ``body`` of one submission to ``board`` as a packed run of
        one (``rankd.frontends._rest.pack``), if it is plain and the engine's
        packed path takes it; else None (see :meth:`submit_json`)."""
        if pack_json is None:
            return None
        packed = pack_json(board, body)
        if packed is None or not self.takes_packed(packed, True):
            return None  # (a missing, signed or expiring board: the general way)
        return packed

    def _checked(self, board: str, event: object) -> object:
        """``event`` with its signature verified and removed, on signed boards."""
        known = self.engine.boards.get(board)
        if known is not None and known.config.signed:
            return signing.verify(self.signing_secret, board, event, self.engine.clock())
        return event

    async def submit_many(self, items: list[tuple[str, object]], *,
                          describe: Callable[[EngineError], dict[str, Any]] = EngineError.to_dict
                          ) -> list[dict[str, Any]]:
        """``(board, event)`` pairs in order: a result or ``{"error": ...}`` each.

        One bad event gets its own error; the rest go through the engine's
        batch path in one call (one WAL append, one commit).
        """
        if len(items) > MAX_BATCH:
            raise TooLarge(f"a batch holds at most {MAX_BATCH} events, got {len(items)}")
        slots: list[Any] = []
        submissions = []
        for board, event in items:
            try:
                submissions.append(Submission.from_dict(board, self._checked(board, event)))
                slots.append(None)
            except EngineError as exc:
                slots.append({"error": describe(exc)})
        answers = iter(await self.engine.submit_many(submissions))
        results = []
        for slot in slots:
            if slot is None:
                answer = next(answers)
                slot = ({"error": describe(answer)} if isinstance(answer, EngineError)
                        else zeros.shown(answer))  # (-0 shows as 0, as in reads)
            results.append(slot)
        return results

    async def submit_prepared(self, submissions: list[Submission]
                              ) -> list[dict[str, Any] | EngineError]:
        """Submissions a front-end built itself (RESP), in order: a result or
        an ``EngineError`` each.  Boards that take only signed submissions
        refuse them (a signature covers REST and TCP submissions' fields)."""
        if len(submissions) > MAX_BATCH:
            raise TooLarge(f"a batch holds at most {MAX_BATCH} events, got {len(submissions)}")
        boards = self.engine.boards
        refused = {s.board for s in submissions
                   if (known := boards.get(s.board)) is not None and known.config.signed}
        if not refused:
            return await self.engine.submit_many(submissions)
        taken = [s for s in submissions if s.board not in refused]
        answers = iter(await self.engine.submit_many(taken))
        return [InvalidInput(f"board {s.board!r} takes only signed submissions (REST or "
                             "TCP)") if s.board in refused else next(answers)
                for s in submissions]

    async def submit_packed(self, packed: Any) -> None:
        """Submit packed submissions (``rankd.engine._packed.Packed``, read by
        a native front-end; see ``takes_packed``); their answers go into
        ``packed``."""
        await self.engine.submit_packed(packed)

    async def remove_members(self, board: str, choose: Callable[[SortedView], list[str]], *,
                             window: str | None = None, period: str | None = None,
                             drop_when_empty: bool = False, persist_when_empty: bool = False
                             ) -> list[tuple[str, float]]:
        """Remove the members ``choose`` picks from a view of the board, at
        once; see ``Engine.remove_members``."""
        return await self.engine.remove_members(
            board, choose, window=optional_text(window, "window"),
            period=optional_text(period, "period"), drop_when_empty=drop_when_empty,
            persist_when_empty=persist_when_empty)

    def remove_members_now(self, board: str, choose: Callable[[SortedView], list[str]], *,
                           window: str | None = None, period: str | None = None,
                           persist_when_empty: bool = False
                           ) -> tuple[list[tuple[str, float]], asyncio.Future[None] | None
                                      ] | None:
        """:meth:`remove_members` applied at once, its commit to await (or
        None where it would wait); see ``Engine.remove_members_now``."""
        return self.engine.remove_members_now(
            board, choose, window=optional_text(window, "window"),
            period=optional_text(period, "period"), persist_when_empty=persist_when_empty)

    async def replace_board(self, board: str, config: object,
                            entries: Callable[[], Iterable[tuple[str, float]]]) -> int:
        """Board ``board`` made anew holding what ``entries()`` gives, in one
        commit; see ``Engine.replace_board``."""
        return await self.engine.replace_board(board, config, entries)

    def stage_board(self, board: str, config: object) -> Staging:
        """Board ``board`` made anew in steps, swapped in at once; see
        ``Engine.stage``."""
        return self.engine.stage(board, config)

    def hold_writes(self, boards: Iterable[str]) -> AbstractAsyncContextManager[
            Callable[[], None]]:
        """Writes to ``boards`` held meanwhile; see ``Engine.hold_writes``."""
        return self.engine.hold_writes(boards)

    async def remove_member(self, board: str, member: str) -> None:
        if not await self.engine.remove_member(board, member):
            raise NotFound(f"no member {member!r}")

    # --- reads ----------------------------------------------------------------------------

    def top(self, board: str, *, window: str | None = None, period: str | None = None,
            offset: int = 0, limit: int = 10) -> dict[str, Any]:
        return orjson.loads(self.top_json(board, window=window, period=period, offset=offset,
                                          limit=limit))

    def top_json(self, board: str, *, window: str | None = None, period: str | None = None,
                 offset: int = 0, limit: int = 10) -> bytes:
        """The page as JSON, cached per board version: a burst of identical
        reads between two writes serializes once and ranks nothing."""
        limit = integer(limit, "limit", 1, MAX_LIMIT)
        offset = integer(offset, "offset", 0, MAX_OFFSET)
        version, window, period = self.engine.read_version(
            board, optional_text(window, "window"), optional_text(period, "period"))
        key = (board, window, period, offset, limit)
        cached = self._top_cache.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        data = orjson.dumps(self.engine.top(board, window=window, period=period, offset=offset,
                                            limit=limit))
        self._top_cache.put(key, version, data)
        return data

    def view(self, board: str, *, window: str | None = None, period: str | None = None
             ) -> SortedView:
        """A window of the board as a sorted set (``rankd.engine.view``)."""
        return self.engine.view(board, optional_text(window, "window"),
                                optional_text(period, "period"))

    def member(self, board: str, member: str, *, window: str | None = None,
               period: str | None = None) -> dict[str, Any]:
        standing = self.engine.standing(board, member, window=optional_text(window, "window"),
                                        period=optional_text(period, "period"))
        if standing is None:
            raise _no_member(member)
        return standing

    def member_json(self, board: str, member: str) -> bytes:
        """:meth:`member`'s answer (its window and period the board's
        current ones) as JSON: written natively where the index is the
        native one, with no dict made (``rankd.frontends._rest_reads``)."""
        if standing_json is not None:
            found, window, period, index = self.engine.standing_read(board, member)
            if index is None:
                raise _no_member(member)
            data = standing_json(index, member, found.labels.get(member), window, period,
                                 found.version)
            if data is not None:
                if not data:
                    raise _no_member(member)
                return data
        return orjson.dumps(self.member(board, member))

    def around(self, board: str, member: str, *, above: int = 4, below: int = 4,
               window: str | None = None, period: str | None = None) -> dict[str, Any]:
        entries = self.engine.around(
            board, member, above=integer(above, "above", 0, MAX_AROUND),
            below=integer(below, "below", 0, MAX_AROUND),
            window=optional_text(window, "window"), period=optional_text(period, "period"))
        if entries is None:
            raise NotFound(f"no member {member!r} in that window")
        return {"entries": entries}

    def ranks(self, board: str, members: object, *, window: str | None = None,
              period: str | None = None) -> dict[str, Any]:
        if not isinstance(members, list):
            raise InvalidInput("members must be a list of member names")
        if len(members) > MAX_RANKS_MEMBERS:
            raise TooLarge(f"at most {MAX_RANKS_MEMBERS} members, got {len(members)}")
        return self.engine.ranks(board, members, window=optional_text(window, "window"),
                                 period=optional_text(period, "period"))

    def periods(self, board: str, *, window: str | None = None) -> dict[str, Any]:
        return self.engine.periods(board, optional_text(window, "window"))


def _no_member(member: str) -> NotFound:
    return NotFound(f"no member {member!r} in that window")


def check_fields(data: object, required: set[str], optional: set[str], what: str
                 ) -> dict[str, Any]:
    """``data`` as a dict with the required fields and no unknown ones."""
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} must be an object")
    missing = sorted(required - set(data))
    if missing:
        raise InvalidInput(f"{what} needs field(s): {', '.join(missing)}")
    unknown = sorted(map(str, set(data) - required - optional))
    if unknown:
        raise InvalidInput(f"unknown field(s) in {what}: {', '.join(unknown)}")
    return data
