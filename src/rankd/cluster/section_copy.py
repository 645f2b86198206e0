"""One large section of a group's snapshot into ``rankd_group_snapshots``,
streamed a piece a loop step by binary COPY (``ClusterLog.store_snapshot``).

A statement's parameter is encoded in one loop step: a 35 MiB index section
held the event loop 40-80 ms (copied into asyncpg's buffer, its fresh memory
faulted in).  COPY has no ``ON CONFLICT DO NOTHING``, and asyncpg's COPY
waits for its transport to take more data under no timeout, which a
connection Postgres closed never does: both are handled here.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import asyncpg

#: The binary COPY stream's header (signature, flags, no extension) and trailer.
_COPY_HEAD = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_END = b"\xff\xff"
#: A snapshot row's fields before its data: six fields, each length-prefixed.
_COPY_ROW = struct.Struct("!hiiiqiqiiiii")
_COLUMNS = ["group_id", "seq", "epoch", "part", "parts", "data"]


async def copy_section(conn: asyncpg.Connection, group: int, seq: int, epoch: int,
                       part: int, parts: int, data: bytes, piece: int) -> None:
    """Store part ``part`` of ``parts`` of the group's snapshot at ``seq``,
    within the caller's transaction.  Nothing if the part is stored already:
    by the check, or, when another store of the same snapshot committed it
    after the check, by the unique violation the COPY then meets (in a
    savepoint, so the caller's transaction goes on as an ``INSERT ... ON
    CONFLICT DO NOTHING`` would).  Raises at once if Postgres closes the
    connection meanwhile."""
    if await conn.fetchval("SELECT 1 FROM rankd_group_snapshots WHERE group_id = $1 "
                           "AND seq = $2 AND part = $3", group, seq, part):
        return

    async def stream() -> AsyncIterator[bytes]:
        yield _COPY_HEAD + _COPY_ROW.pack(6, 4, group, 8, seq, 8, epoch, 4, part, 4, parts,
                                          len(data))
        view = memoryview(data)
        for start in range(0, len(data), piece):  # (one loop step each)
            yield bytes(view[start:start + piece])
        yield _COPY_END

    with contextlib.suppress(asyncpg.UniqueViolationError):
        async with conn.transaction():  # (a savepoint)
            await _unless_closed(conn, conn.copy_to_table(
                "rankd_group_snapshots", source=stream(), format="binary", columns=_COLUMNS))


async def _unless_closed(conn: asyncpg.Connection, copying) -> None:
    """Await ``copying`` (a COPY on ``conn``), or raise as soon as ``conn``
    is closed: asyncpg's COPY would wait for good for the closed transport
    to take more data (a backend Postgres ended, a restart)."""
    closed = asyncio.get_running_loop().create_future()

    def on_closed(_conn: object) -> None:
        if not closed.done():
            closed.set_result(None)

    conn.add_termination_listener(on_closed)
    task = asyncio.ensure_future(copying)
    try:
        await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise asyncpg.ConnectionDoesNotExistError(
                "the connection was closed while a snapshot section was copied")
        task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        # (a pool's connection closed is detached from its proxy: this raises)
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.remove_termination_listener(on_closed)
