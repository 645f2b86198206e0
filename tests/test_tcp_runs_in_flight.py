"""A TCP connection answered in any order holds at most
``MAX_RUNS_IN_FLIGHT`` runs with the engine, however its requests arrive
(``rankd.frontends.tcp_any_order``): each read that finds the connection
idle used to be handed over from ``data_received`` without looking at the
count, so a client pipelining single submits to a group slow to commit
grew the connection's in-flight runs (and their memory) without bound.

The engine here is a stand-in that holds every run until the test
completes it, as a group whose log append waits does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import native
from rankd import wire
from rankd.engine.errors import InvalidInput
from rankd.engine.groups import group_of
from rankd.frontends import tcp
from rankd.frontends.tcp import MAX_RUNS_IN_FLIGHT, TcpServer


class HeldEngine:
    """A service whose engine takes every packed run and commits none
    until :meth:`complete`."""

    def __init__(self) -> None:
        self.held: list[tuple[Any, Any, Any]] = []
        self.engine = SimpleNamespace(replication=object())

    def takes_packed(self, packed: Any, existing: bool = False) -> bool:
        return True

    def submit_packed_then(self, packed: Any, then: Any, token: Any) -> None:
        self.held.append((packed, then, token))

    def complete(self) -> int:
        """Fail every held run (answered with its error); how many there were."""
        held, self.held = self.held, []
        for _, then, token in held:
            then(token, InvalidInput("completed by the test"))
        return len(held)


class Transport:
    """What the connection writes, and whether it paused reading."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.paused = False
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.data += chunk

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    abort = close


def answers(data: bytes) -> list[int]:
    decoder = wire.FrameDecoder()
    return [message[0] for message in decoder.feed(bytes(data))]


async def connected(service: HeldEngine) -> tuple[Any, Transport]:
    """A connection to ``service`` that said hello asking for answers in any
    order (granted: ``service`` is a cluster node's), and its transport."""
    conn = TcpServer(service)._connection()  # type: ignore[arg-type]
    transport = Transport()
    conn.connection_made(transport)
    conn.data_received(wire.request(1, "hello", {"version": 1, "out_of_order": True}))
    await asyncio.sleep(0.01)
    assert answers(transport.data) == [1] and conn.any_order
    transport.data.clear()
    return conn, transport


@pytest.mark.skipif(not native or not tcp.FAST_SUBMITS, reason="needs the native fast path")
def test_runs_in_flight_stay_bounded_however_the_submits_are_read() -> None:
    async def run() -> None:
        service = HeldEngine()
        conn, transport = await connected(service)
        count = 3 * MAX_RUNS_IN_FLIGHT
        for n in range(count):  # each submit read alone: one run each
            conn.data_received(wire.request(100 + n, "submit",
                                            {"board": "b", "member": f"m{n}", "score": n}))
            await asyncio.sleep(0)
            assert len(conn.answering) <= MAX_RUNS_IN_FLIGHT, n
        # What was not handed over waits its turn; each is answered once, in the end.
        for _ in range(100):
            if service.complete() == 0 and not conn.busy:
                break
            await asyncio.sleep(0.01)
        assert sorted(answers(transport.data)) == list(range(100, 100 + count))
        assert not conn.answering

    asyncio.run(run())


class GroupEngine(HeldEngine):
    """A cluster node's service that holds every run, and takes only runs
    of one board group (as ``Service.takes_packed`` on a node writing all)."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0  # the most runs the connection had in flight at a hand-over
        self.conn: Any = None

    def takes_packed(self, packed: Any, existing: bool = False) -> bool:
        return len({group_of(name) for name in packed.board_names()}) == 1

    def submit_packed_then(self, packed: Any, then: Any, token: Any) -> None:
        super().submit_packed_then(packed, then, token)
        self.most = max(self.most, len(self.conn.answering))


def boards_of_distinct_groups(count: int) -> list[str]:
    boards: dict[int, str] = {}
    n = 0
    while len(boards) < count:
        boards.setdefault(group_of(f"g{n}"), f"g{n}")
        n += 1
    return list(boards.values())


@pytest.mark.skipif(not native or not tcp.FAST_SUBMITS, reason="needs the native fast path")
@pytest.mark.parametrize("bound, groups", [(MAX_RUNS_IN_FLIGHT, 8), (4, 11)])
def test_a_run_cut_by_group_never_passes_the_bound(monkeypatch, bound: int,
                                                   groups: int) -> None:
    """A run over several groups is cut into one run per group; the cut
    runs count against ``MAX_RUNS_IN_FLIGHT`` like any other, and a run of
    more groups than the bound still goes over, as room comes back."""
    monkeypatch.setattr(tcp, "MAX_RUNS_IN_FLIGHT", bound)

    async def run() -> None:
        service = GroupEngine()
        conn, transport = await connected(service)
        service.conn = conn
        conn.max_runs = bound
        boards = boards_of_distinct_groups(groups)
        ids = iter(range(100, 100_000))
        sent: list[int] = []

        def submit(board: str) -> bytes:
            sent.append(next(ids))
            return wire.request(sent[-1], "submit", {"board": board, "member": "m",
                                                     "score": sent[-1]})

        for _ in range(bound - 1):  # one short of the bound, each a run of one group
            conn.data_received(submit(boards[0]))
            await asyncio.sleep(0)
        assert len(conn.answering) == bound - 1
        # Then runs each over every group, read whole.
        for _ in range(3):
            conn.data_received(b"".join(submit(board) for board in boards))
            await asyncio.sleep(0)
        for _ in range(200):
            await asyncio.sleep(0.005)
            assert len(conn.answering) <= bound
            if service.complete() == 0 and not conn.busy:
                break
        assert service.most <= bound
        assert sorted(answers(transport.data)) == sent  # each answered once
        assert not conn.answering

    asyncio.run(run())
