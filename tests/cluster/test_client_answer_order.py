"""One slow board group holds no other group's answers on a shared TCP
connection (``rankd.frontends.tcp_any_order``), and a client that did not
ask for that is answered in request order as before.

The slow group is made slow in Postgres itself: another session holds the
group's register row locked, as a cut-over or a lease renewal does for a
moment, so its appends wait for the lock while the other groups' commit at
once.  The node's lease is long, so no lease renewal of its own runs while
the test does.  Without the native modules (``RANKD_PURE_PYTHON=1``) every
request goes the general path, in order: skipped."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
from cluster_nodes import boards_in_distinct_groups, nodes

from conftest import native
from rankd import wire
from rankd.client import AsyncClient, Client
from rankd.cluster.groups import group_of

#: How long each append of the slow group takes.
SLOW = 1.2
#: An answer that waited for the slow group came after this much.
HELD = 0.8 * SLOW


@contextlib.contextmanager
def register_held(dsn: str, group: int) -> Iterator[None]:
    """``group``'s register row held locked by another session for
    :data:`SLOW` seconds from the start of the ``with`` block: its appends
    wait that long."""
    locked, failed = threading.Event(), []

    async def hold() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM rankd_groups WHERE group_id = $1 FOR UPDATE",
                                   group)
                locked.set()
                await asyncio.sleep(SLOW)
        finally:
            await conn.close()

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:  # (seen by the test, not lost in the thread)
            failed.append(exc)
            locked.set()

    holder = threading.Thread(target=run, daemon=True)
    holder.start()
    assert locked.wait(10) and not failed, failed
    try:
        yield
    finally:
        holder.join(10 + SLOW)
        assert not failed, failed


def raw_answers(port: int, hello: dict[str, Any], frames: bytes, count: int
                ) -> list[tuple[float, Any]]:
    """Say ``hello``, send ``frames`` in one write, and read ``count``
    answers: each with the seconds it took from the write."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    decoder, backlog = wire.FrameDecoder(), []
    try:
        sock.sendall(wire.request(1, "hello", {"version": 1, **hello}))
        while not backlog:
            backlog.extend(decoder.feed(sock.recv(1 << 16)))
        assert backlog.pop(0)[1] == wire.OK
        started = time.monotonic()
        sock.sendall(frames)
        answers: list[tuple[float, Any]] = []
        while len(answers) < count:
            data = sock.recv(1 << 16)
            assert data, "closed by the server"
            answers.extend((time.monotonic() - started, message)
                           for message in decoder.feed(data))
        return answers
    finally:
        sock.close()


def submit_frame(request_id: int, board: str, member: str) -> bytes:
    return wire.request(request_id, "submit", {"board": board, "member": member, "delta": 1})


def test_a_slow_group_holds_no_other_groups_answers_unless_in_order_was_asked(
        tmp_path: Path, pg_dsn: str) -> None:
    # Plain submits take the native fast path, which alone hands runs over
    # (the general path answers a connection's requests one batch at a time).
    native("rankd.frontends._submits", "split")
    slow, fast, missing = boards_in_distinct_groups("order", 3)
    assert len({group_of(slow), group_of(fast), group_of(missing)}) == 3
    with nodes(tmp_path, pg_dsn, 1, "--replicas", "0", "--lease-seconds", "60") as (daemon,):
        port = daemon.tcp_port
        with Client("127.0.0.1", port) as client:
            for board in (slow, fast):
                client.put_board(board, {"policy": "sum"})
                client.submit(board, "seed", delta=1)  # the node takes the group

        # The client asks for any order: two callers on one connection, the
        # fast group's answer comes at once.
        async def shared() -> dict[str, float]:
            async with AsyncClient("127.0.0.1", port) as client:
                assert client.server_info["out_of_order"] is True
                started = time.monotonic()
                took: dict[str, float] = {}

                async def timed(board: str) -> None:
                    assert (await client.submit(board, "a", delta=1))["score"] == 1
                    took[board] = time.monotonic() - started
                await asyncio.gather(timed(slow), timed(fast))
                return took
        with register_held(pg_dsn, group_of(slow)):
            took = asyncio.run(shared())
        assert took[fast] < SLOW / 2 <= HELD <= took[slow], took

        # Submits in one read (one packed run over three groups): cut by
        # group, the fast one answered first; the part the fast path does
        # not take (a board that does not exist, of a group no node holds)
        # goes the general way, behind the runs in flight.
        frames = (submit_frame(2, slow, "b") + submit_frame(3, fast, "b")
                  + submit_frame(4, missing, "b"))
        with register_held(pg_dsn, group_of(slow)):
            answers = raw_answers(port, {"out_of_order": True}, frames, 3)
        assert [message[0] for _, message in answers] == [3, 2, 4], answers
        assert answers[0][0] < SLOW / 2 and answers[1][0] >= HELD, answers
        assert [message[2]["score"] for _, message in answers[:2]] == [1, 1], answers
        _, status, body = answers[2][1]
        assert status == wire.ERROR and body["code"] == "not_found", answers

        # A client that did not ask (every client before the option) gets
        # its answers in request order, the fast one behind the slow one.
        frames = submit_frame(2, slow, "c0") + submit_frame(3, fast, "c0")
        with register_held(pg_dsn, group_of(slow)):
            answers = raw_answers(port, {}, frames, 2)
        assert [message[0] for _, message in answers] == [2, 3], answers
        assert answers[0][0] >= HELD, answers
        with Client("127.0.0.1", port, out_of_order=False) as client:
            assert "out_of_order" not in client.server_info
            assert client.submit(fast, "d", delta=2)["score"] == 2
            assert client.member(slow, "c0")["score"] == 1
