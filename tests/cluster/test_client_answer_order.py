"""One slow board group holds no other group's answers on a shared TCP
connection (``rankd.frontends.tcp_any_order``), and a client that did not
ask for that is answered in request order as before.

The slow group is made slow in Postgres itself: a trigger on the cluster's
log sleeps in every append of that group (and of no other), so its writes
commit late while the others' commit at once.  The node's lease is long,
so no lease renewal (which would wait on the slow group's row) runs while
the test does.  Without the native modules (``RANKD_PURE_PYTHON=1``) every
request goes the general path, in order: skipped."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from cluster_nodes import boards_in_distinct_groups, nodes, sql

from conftest import native
from rankd import wire
from rankd.client import AsyncClient, Client
from rankd.cluster.groups import group_of

#: How long each append of the slow group takes.
SLOW = 1.2
#: An answer that waited for the slow group came after this much.
HELD = 0.8 * SLOW


def slow_appends_of(dsn: str, group: int) -> None:
    """Every log append of ``group`` sleeps :data:`SLOW` seconds in Postgres."""
    sql(dsn, "CREATE OR REPLACE FUNCTION test_slow_append() RETURNS trigger "
             f"LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep({SLOW}); RETURN NEW; END $$")
    sql(dsn, "CREATE TRIGGER test_slow_append BEFORE INSERT ON rankd_log FOR EACH ROW "
             f"WHEN (NEW.group_id = {int(group)}) EXECUTE FUNCTION test_slow_append()")


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
        slow_appends_of(pg_dsn, group_of(slow))

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
        took = asyncio.run(shared())
        assert took[fast] < SLOW / 2 <= HELD <= took[slow], took

        # Submits in one read (one packed run over three groups): cut by
        # group, the fast one answered first; the part the fast path does
        # not take (a board that does not exist, of a group no node holds)
        # goes the general way, behind the runs in flight.
        frames = (submit_frame(2, slow, "b") + submit_frame(3, fast, "b")
                  + submit_frame(4, missing, "b"))
        answers = raw_answers(port, {"out_of_order": True}, frames, 3)
        assert [message[0] for _, message in answers] == [3, 2, 4], answers
        assert answers[0][0] < SLOW / 2 and answers[1][0] >= HELD, answers
        assert [message[2]["score"] for _, message in answers[:2]] == [1, 1], answers
        _, status, body = answers[2][1]
        assert status == wire.ERROR and body["code"] == "not_found", answers

        # A client that did not ask (every client before the option) gets
        # its answers in request order, the fast one behind the slow one.
        frames = submit_frame(2, slow, "c0") + submit_frame(3, fast, "c0")
        answers = raw_answers(port, {}, frames, 2)
        assert [message[0] for _, message in answers] == [2, 3], answers
        assert answers[0][0] >= HELD, answers
        with Client("127.0.0.1", port, out_of_order=False) as client:
            assert "out_of_order" not in client.server_info
            assert client.submit(fast, "d", delta=2)["score"] == 2
            assert client.member(slow, "c0")["score"] == 1
