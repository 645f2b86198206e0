"""The TCP fast path for plain submit requests against the general path.

* the native scanner splits a stream exactly as ``wire.FrameDecoder`` does,
  packs only genuine plain submits, and packs their fields faithfully;
* packed submissions ingested natively and answered by the native encoder
  give the response frames, WAL records and state the general path gives;
* a real server answers a random stream of requests (plain submits mixed
  with everything else: other ops, odd encodings, bad requests, a signed
  board, a rate limit) with the same bytes whether the fast path is on or
  off, and leaves the same boards.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import native
from engine_helpers import SUNDAY, FakeClock, engine_config
from rankd import wire
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.engine import Engine
from rankd.engine.errors import ReadOnly
from rankd.engine.ingest import ingest_python
from rankd.frontends import tcp
from rankd.frontends.service import Service
from rankd.index import kinds
from rankd.security import Gate
from rankd.security.auth import AuthConfig, Authenticator
from rankd.security.limits import LimitsConfig, RateLimiter

# Native and reference boards are compared side by side: one dedupe key.
pytestmark = pytest.mark.usefixtures("same_event_id_keys")

MAX_FRAME = 4096


def split():
    return native("rankd.frontends._submits", "split")


def encode_answers():
    return native("rankd.frontends._submits", "encode_answers")


def ingest_packed():
    return native("rankd.engine._ingest", "ingest_packed")


# --- requests ------------------------------------------------------------------------------

def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` nine times in ten, else ``bad``."""
    return st.integers(0, 9).flatmap(lambda roll: bad if roll == 0 else good)


texts = mostly(st.sampled_from(["ann", "bob", "cy", "arena", "wins", "e1", "e2", "Ann"]),
               st.sampled_from(["", "é", "x" * 40, "y" * 300]))
numbers = st.one_of(st.integers(-50, 50), st.floats(-100, 100, allow_nan=False),
                    st.sampled_from([None, 2**53 + 1, 2**64 - 1, -(2**63), math.inf, True, "3"]))
plain_args = st.fixed_dictionaries(
    {"board": st.sampled_from(["arena", "wins", "signed", "missing"]), "member": texts},
    optional={"delta": numbers, "score": numbers, "event_id": st.one_of(st.none(), texts),
              "label": st.one_of(st.none(), texts), "ts": st.none()})


def odd(args: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Submit arguments that are not plain: another key, a ts, a non-str board."""
    return st.sampled_from([{**args, "extra": 1}, {**args, "ts": SUNDAY}, {**args, "board": 5},
                            {k: v for k, v in args.items() if k != "member"}])


request_ids = mostly(st.integers(1, 2**32 - 1), st.sampled_from([0, -1, 2**32, "x"]))
submit_requests = st.builds(lambda rid, args: [rid, "submit", args], request_ids,
                            mostly(plain_args, plain_args.flatmap(odd)))
other_requests = st.one_of(
    st.builds(lambda rid: [rid, "top", {"board": "arena"}], st.integers(1, 99)),
    st.builds(lambda rid, m: [rid, "member", {"board": "wins", "member": m}],
              st.integers(1, 99), texts),
    st.builds(lambda rid, args: [rid, "submit_many", {"events": [{"board": "wins", **args}]}],
              st.integers(1, 99), st.fixed_dictionaries({"member": texts, "delta": numbers})),
    st.just([7, "submit"]), st.just({"not": "a request"}),
)


def frame(message: Any, how: str) -> bytes:
    """``message`` framed; ``how`` may choose an encoding the fast path does
    not read (float32 numbers, str8 keys) but msgpack decodes alike."""
    if how == "float32":
        payload = msgpack.packb(message, use_bin_type=True, use_single_float=True)
    else:
        payload = msgpack.packb(message, use_bin_type=True)
    return len(payload).to_bytes(4, "big") + payload


encodings = st.sampled_from(["plain", "plain", "plain", "float32"])
streams = st.lists(st.tuples(mostly(submit_requests, other_requests),
                             encodings).map(lambda pair: frame(*pair)), max_size=25)


# --- the scanner ---------------------------------------------------------------------------


def expand(data: bytes, items: list[Any]) -> list[Any]:
    """The scanner's items as decoded requests (a packed run: its sources)."""
    out = []
    for item in items:
        if type(item) is tuple:
            out.append(msgpack.unpackb(data[item[0]:item[1]], raw=False))
        else:
            out.extend(msgpack.unpackb(source, raw=False) for source in item.sources())
    return out


@given(streams, st.integers(0, 30), st.sampled_from([None, 0, MAX_FRAME + 1]))
def test_the_scanner_splits_as_the_decoder_does(frames, cut, bad_length):
    data = b"".join(frames)
    if bad_length is not None:
        data += bad_length.to_bytes(4, "big") + b"\x00" * 8
    data = data[:max(0, len(data) - cut)] if bad_length is None else data
    items, end, bad = split()(data, MAX_FRAME, True)
    decoder = wire.FrameDecoder(MAX_FRAME)
    try:
        expected = decoder.feed(data)
        error = None
    except wire.FrameError as exc:
        expected, error = exc.decoded, exc
    assert expand(data, items) == expected
    if error is None:
        assert bad == -1 and end == len(data) - decoder.pending_bytes
    else:
        assert bad == bad_length
    unpacked = split()(data, MAX_FRAME, False)[0]
    assert all(type(item) is tuple for item in unpacked)
    assert expand(data, unpacked) == expected


def test_plain_submits_are_packed_with_their_fields():
    requests = [[1, "submit", {"board": "wins", "member": "ann", "delta": 3, "event_id": "e1"}],
                [2, "submit", {"member": "bob", "board": "arena", "score": -2.5, "label": "B",
                               "ts": None, "event_id": None}],
                [3, "top", {"board": "arena"}],
                [4, "submit", {"board": "wins", "member": "ann", "delta": 2**64 - 1}]]
    data = b"".join(frame(r, "plain") for r in requests)
    items, end, bad = split()(data, MAX_FRAME, True)
    assert (end, bad) == (len(data), -1)
    first, other, last = items
    assert type(other) is tuple and len(first) == 2 and len(last) == 1
    assert first.tags() == [1, 2] and last.tags() == [4]
    ann, bob = first.submissions()
    assert (ann.board, ann.member, ann.delta, ann.score, ann.event_id, ann.label) == (
        "wins", "ann", 3, None, "e1", None)
    assert (bob.board, bob.member, bob.delta, bob.score, bob.event_id, bob.label) == (
        "arena", "bob", None, -2.5, None, "B")
    assert last.submissions()[0].delta == 2**64 - 1


# --- the kernel and the encoder ------------------------------------------------------------


NATIVE_KINDS = {"skiplist": "rankd._skiplist", "pages": "rankd._pages"}


def make_boards(kind: str | None = None) -> dict[str, Board]:
    # The kind the native ingest writes through is the process's
    # (rankd.index.kinds); ``kind`` builds the boards' new periods otherwise.
    index_class = native(NATIVE_KINDS[kind or kinds.current_kind()], "RankIndex")
    boards = {}
    for name, config in (("arena", {"policy": "best"}), ("wins", {"policy": "sum",
                                                                  "max_delta": 20,
                                                                  "windows": ["all", "daily"]})):
        board = Board(name, BoardConfig.from_dict(config))
        board.new_index = lambda board=board: index_class(  # type: ignore[method-assign]
            board.config.order, board.config.tie_break)
        boards[name] = board
    return boards


def state(boards: dict[str, Board]) -> list[Any]:
    return [(name, board.version, list(board.labels.items()), board.dedupe.packed_items(),
             {(w, p): index.dump() for w, periods in board.periods.items()
              for p, index in periods.items()}) for name, board in boards.items()]


@settings(max_examples=200)
@given(st.lists(st.builds(lambda rid, args: [rid, "submit", args], st.integers(1, 2**32 - 1),
                          plain_args), min_size=1, max_size=30))
def test_packed_ingest_answers_and_records_like_the_general_path(requests):
    data = b"".join(frame(r, "plain") for r in requests)
    runs = [item for item in split()(data, MAX_FRAME, True)[0] if type(item) is not tuple]
    now, ttl, tolerance = SUNDAY + 3600.5, 3600.0, 300.0
    fast_boards, general_boards = make_boards(), make_boards()
    fast_frames, general_frames, fast_records, general_records = [], [], [], []
    lsn = 1
    for packed in runs:
        done = ingest_packed()(fast_boards, [packed], now, lsn, ttl, tolerance)
        fast_records += done.payloads
        fast_frames.append(encode_answers()(packed, wire.ok, wire.error)[0])
        reference = ingest_python(general_boards, packed.submissions(), now, lsn, ttl,
                                  tolerance)
        general_records += reference.payloads
        for tag, answer in zip(packed.tags(), reference.answers, strict=True):
            general_frames.append(wire.ok(tag, answer) if isinstance(answer, dict)
                                  else wire.error(tag, answer.code, answer.message))
        lsn += len(done.payloads)
    assert b"".join(fast_frames) == b"".join(general_frames)
    assert fast_records == general_records
    assert state(fast_boards) == state(general_boards)


def test_a_new_period_of_another_index_kind_is_refused_before_any_write():
    # The native ingest writes a board's periods through the C entry points
    # of the process's index kind; a period built of another class (a board
    # whose ``new_index`` disagrees with rankd.index.kinds) was written as
    # if it were that kind: memory misread (a crash).  Refused now, before
    # any window of the submission is written.
    other = "skiplist" if kinds.current_kind() == "pages" else "pages"
    boards = make_boards(other)
    packed = [item for item in split()(frame([1, "submit", {"board": "wins", "member": "ann",
                                                             "delta": 3}], "plain"),
                                       MAX_FRAME, True)[0] if type(item) is not tuple]
    with pytest.raises(TypeError, match="not the kind this process writes natively"):
        ingest_packed()(boards, packed, SUNDAY + 3600.5, 1, 3600.0, 300.0)
    assert all(len(index) == 0 for periods in boards["wins"].periods.values()
               for index in periods.values())


# --- a real server, both ways --------------------------------------------------------------


async def serve_and_send(tmp_path, chunks: list[bytes], fast: bool,
                         limits: LimitsConfig | None, pause: bool) -> tuple[bytes, str]:
    tcp.FAST_SUBMITS = fast
    engine = await Engine.open(engine_config(tmp_path), clock=FakeClock(SUNDAY + 7200))
    try:
        await engine.put_board("arena", {"policy": "best"})
        await engine.put_board("wins", {"policy": "sum", "max_delta": 20})
        await engine.put_board("signed", {"policy": "sum", "signed": True})
        limiter = RateLimiter(limits or LimitsConfig(0, 0, 0, 0))
        for buckets in limiter._buckets.values():
            buckets.clock = lambda: 0.0  # no refill: both runs see the same tokens
        gate = Gate(Authenticator(AuthConfig()), limiter)
        server = tcp.TcpServer(Service(engine, signing_secret="s3cret"), gate,
                               max_frame=MAX_FRAME)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wire.request(1, "hello", {"version": 1}))
        received = await reader.readexactly(4)
        received += await reader.readexactly(int.from_bytes(received, "big"))
        for chunk in chunks:
            writer.write(chunk)  # each chunk in one write: the server reads runs of requests
            await writer.drain()
            if pause:  # else the next chunk may come while runs are being committed
                await asyncio.sleep(0.01)
        writer.write(wire.request(99, "health", {}))
        decoder = wire.FrameDecoder()
        done = False
        while not done:
            data = await asyncio.wait_for(reader.read(1 << 16), 10)
            if not data:
                break
            received += data
            # The health answer, not an answer to a generated request that has id 99 too.
            done = any(isinstance(m, list) and m[0] == 99 and isinstance(m[2], dict)
                       and "status" in m[2] for m in decoder.feed(data))
        writer.close()
        await server.close(grace=1)
        return received, engine.digest()
    finally:
        await engine.close(snapshot=False)
        tcp.FAST_SUBMITS = native_fast


native_fast = tcp.FAST_SUBMITS


@settings(max_examples=40, deadline=None)
@given(st.lists(streams, min_size=1, max_size=4), st.booleans(), st.booleans(),
       st.none() | st.lists(st.integers(0, 1 << 12), max_size=6))
def test_a_server_answers_the_same_bytes_with_and_without_the_fast_path(tmp_path_factory,
                                                                        chunks, limited, pause,
                                                                        cuts):
    if not native_fast:
        native("rankd.frontends._submits", "split")  # skip, or fail under RANKD_REQUIRE_NATIVE
        pytest.skip("the fast path is off (RANKD_PURE_PYTHON)")
    data = [b"".join(frames) for frames in chunks]
    if cuts is not None:  # frames cut across writes (the decoder holds a part between reads)
        whole = b"".join(data)
        at = sorted({0, len(whole), *(cut % (len(whole) + 1) for cut in cuts)})
        data = [whole[start:end] for start, end in itertools.pairwise(at)]
    # A write limit on loopback small enough that some runs are refused as a whole.
    limits = LimitsConfig(address_writes=5, address_reads=1000, credential_writes=0,
                          credential_reads=0, exempt_loopback=False) if limited else None
    results = [asyncio.run(serve_and_send(tmp_path_factory.mktemp("fast"), data, fast, limits,
                                          pause)) for fast in (True, False)]
    assert results[0] == results[1]


class Connection:
    """A raw protocol connection to an in-process server, after hello."""

    async def open(self, port: int) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.decoder = wire.FrameDecoder()
        self.responses: list[Any] = []
        await self.send(wire.request(1, "hello", {"version": 1}))
        await self.read_until(1)
        return self

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_until(self, count: int) -> list[Any]:
        while len(self.responses) < count:
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            self.responses.extend(self.decoder.feed(data))
        return self.responses


async def with_server(tmp_path, body) -> Any:
    """``body(engine, connection)`` against an in-process server with
    boards "x" and "y" (policy ``latest``)."""
    engine = await Engine.open(engine_config(tmp_path), clock=FakeClock(SUNDAY + 7200))
    try:
        await engine.put_board("x", {"policy": "latest"})
        await engine.put_board("y", {"policy": "latest"})
        server = tcp.TcpServer(Service(engine), max_frame=MAX_FRAME)
        port = await server.start("127.0.0.1", 0)
        connection = await Connection().open(port)
        try:
            return await body(engine, connection)
        finally:
            connection.writer.close()
            await server.close(grace=1)
    finally:
        await engine.close(snapshot=False)


def plain_submit(request_id: int, board: str, member: str, score: float) -> bytes:
    return frame([request_id, "submit", {"board": board, "member": member, "score": score}],
                 "plain")


def test_a_frame_cut_across_reads_is_read_whole(tmp_path):
    """The rest of a frame cut across reads goes to the decoder that holds
    its start, even when those bytes would read as a plain submit of their
    own (they are the end of a request's binary field here): the lane must
    not take them after a read that left part of a frame behind."""
    native("rankd.frontends._submits", "split")
    inner = plain_submit(4, "x", "mallory", 99.0)
    outer = wire.request(3, "health", {"padding": inner})
    assert outer.endswith(inner)
    cut = len(outer) - len(inner)

    async def body(engine: Engine, connection: Connection) -> list[Any]:
        await connection.send(plain_submit(2, "x", "ann", 1.0))  # the fast path, first
        await connection.read_until(2)
        await connection.send(outer[:cut])
        await asyncio.sleep(0.05)
        await connection.send(outer[cut:])
        await asyncio.sleep(0.05)  # (a read of its own)
        await connection.send(wire.request(5, "health", {}))
        responses = await connection.read_until(4)
        return [[response[0] for response in responses],
                engine.boards["x"].index("all", "all").score("mallory")]

    ids, mallory = asyncio.run(with_server(tmp_path, body))
    assert ids == [1, 2, 3, 5] and mallory is None


def test_a_plain_run_waits_for_the_request_the_connection_is_busy_with(tmp_path):
    """Responses come in request order: a plain run that arrives while the
    connection's worker waits on an earlier request (a general-path submit
    to a board a snapshot holds) is answered after it, not from the fast
    path meanwhile."""
    native("rankd.frontends._submits", "split")

    async def body(engine: Engine, connection: Connection) -> list[int]:
        engine._hold(engine.boards["x"])
        # With a ts: not plain, so it takes the general path, and waits for x.
        await connection.send(frame([2, "submit", {"board": "x", "member": "ann", "score": 1.5,
                                                   "ts": SUNDAY + 7200}], "plain"))
        await asyncio.sleep(0.05)
        await connection.send(plain_submit(3, "y", "bob", 2.0))
        await asyncio.sleep(0.05)
        engine._release(engine.boards["x"])
        return [response[0] for response in await connection.read_until(3)]

    assert asyncio.run(with_server(tmp_path, body)) == [1, 2, 3]


def test_plain_submits_to_a_read_only_engine_get_its_error(tmp_path):
    native("rankd.frontends._submits", "split")

    async def body(engine: Engine, connection: Connection) -> list[Any]:
        await connection.send(plain_submit(2, "x", "ann", 1.0))
        await connection.read_until(2)
        engine.failure = OSError("simulated disk failure")
        await connection.send(plain_submit(3, "x", "ann", 2.0) + plain_submit(4, "y", "bob", 3.0))
        await connection.read_until(4)
        await connection.send(plain_submit(5, "x", "cy", 1.0))
        return await connection.read_until(5)

    responses = asyncio.run(with_server(tmp_path, body))
    assert [r[:2] for r in responses] == [[1, 0], [2, 0], [3, 1], [4, 1], [5, 1]]
    assert {r[2]["code"] for r in responses[2:]} == {ReadOnly.code}


# --- the engine's packed runs ----------------------------------------------------------------


def packed_run(*submits: tuple[str, str, float]) -> Any:
    """One packed run of plain submits ``(board, member, score)``."""
    data = b"".join(frame([tag, "submit", {"board": board, "member": member, "score": score}],
                          "plain") for tag, (board, member, score) in enumerate(submits, 1))
    (packed,) = split()(data, MAX_FRAME, True)[0]
    return packed


def test_a_pass_tells_its_runs_directly_and_in_order(tmp_path):
    """``submit_packed_then``: the pass that commits a run calls ``then``
    itself (never the call that hands the run over), with the run's answers
    in place; a run that went the general way (a held board) is told after
    it is applied, and a read-only engine tells every run why."""
    native("rankd.engine._ingest", "ingest_packed")

    async def body() -> None:
        engine = await Engine.open(engine_config(tmp_path), clock=FakeClock(SUNDAY + 7200))
        told: list[tuple[str, Any, float | None]] = []

        def then(token: str, error: BaseException | None) -> None:
            told.append((token, error, engine.standing("y", "ann")["score"]
                         if engine.standing("y", "ann") else None))
        try:
            await engine.put_board("x", {"policy": "latest"})
            await engine.put_board("y", {"policy": "latest"})
            one, two = packed_run(("y", "ann", 1.0)), packed_run(("y", "ann", 2.0))
            engine.submit_packed_then(one, then, "one")
            engine.submit_packed_then(two, then, "two")
            assert told == []  # not from within the call
            await asyncio.sleep(0)
            assert told == [("one", None, 2.0), ("two", None, 2.0)]  # one pass, applied
            assert [one.answers, two.answers] == [[None], [None]]  # answered natively
            assert engine.wal.last_lsn == engine.wal._written_lsn  # written before telling

            told.clear()
            engine._hold(engine.boards["x"])
            held, behind = packed_run(("x", "bob", 3.0)), packed_run(("y", "ann", 4.0))
            engine.submit_packed_then(held, then, "held")
            engine.submit_packed_then(behind, then, "behind")
            for _ in range(5):
                await asyncio.sleep(0)
            assert told == []
            engine._release(engine.boards["x"])
            for _ in range(50):
                if len(told) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [(token, error) for token, error, _ in told] == [
                ("held", None), ("behind", None)]
            assert engine.standing("x", "bob")["score"] == 3.0

            told.clear()
            engine.failure = OSError("simulated disk failure")
            failing = packed_run(("y", "ann", 9.0))
            engine.submit_packed_then(failing, then, "failing")
            await asyncio.sleep(0)
            assert [(token, type(error)) for token, error, _ in told] == [
                ("failing", ReadOnly)]
            assert engine.standing("y", "ann")["score"] == 4.0
        finally:
            engine.failure = None
            await engine.close(snapshot=False)

    asyncio.run(body())


def test_packed_runs_apply_in_call_order_across_a_snapshot_hold(tmp_path):
    """Runs are applied together at the end of the event loop's pass; a run
    that meets a board held by a snapshot (when handed over, or when its
    pass applies it) goes the general way and waits, and the runs after it
    follow it even once the hold is over, so each board's writes land in
    the order a client pipelined them (as in ``submit_many``, other boards'
    writes do not wait for a held one)."""
    native("rankd.engine._ingest", "ingest_packed")

    async def body() -> None:
        engine = await Engine.open(engine_config(tmp_path), clock=FakeClock(SUNDAY + 7200))
        try:
            await engine.put_board("x", {"policy": "latest"})
            await engine.put_board("y", {"policy": "latest"})
            one, two = packed_run(("y", "ann", 1.0)), packed_run(("y", "bob", 2.0))
            passed = [engine.submit_packed_nowait(one), engine.submit_packed_nowait(two)]
            assert passed[0] is passed[1]  # one pass, one commit
            assert engine.standing("y", "ann") is None  # applied when the pass ends
            await passed[0]
            assert [one.answers, two.answers] == [[None], [None]]  # answered natively
            assert engine.standing("y", "bob")["rank"] == 1

            engine._hold(engine.boards["x"])
            first = packed_run(("x", "ann", 10.0))
            held = engine.submit_packed_nowait(first)
            engine._release(engine.boards["x"])
            then = packed_run(("x", "ann", 5.0), ("y", "ann", 2.0))
            after = engine.submit_packed_nowait(then)
            await asyncio.gather(held, after)
            assert engine.standing("x", "ann")["score"] == 5.0
            assert [a["score"] for a in first.answers + then.answers] == [10.0, 5.0, 2.0]
            assert [a["previous"] for a in then.answers] == [10.0, 1.0]
            assert engine.intake.unpacked == 0

            late, behind = packed_run(("x", "ann", 20.0)), packed_run(("y", "ann", 3.0))
            passed = [engine.submit_packed_nowait(late), engine.submit_packed_nowait(behind)]
            engine._hold(engine.boards["x"])  # after the hand-over, before the pass applies
            for _ in range(10):
                await asyncio.sleep(0)
            assert not passed[0].done() and engine.standing("x", "ann")["score"] == 5.0
            engine._release(engine.boards["x"])
            await passed[0]
            assert [a["score"] for a in late.answers + behind.answers] == [20.0, 3.0]
            assert [a["previous"] for a in late.answers + behind.answers] == [5.0, 2.0]
            assert engine.intake.unpacked == 0
        finally:
            await engine.close(snapshot=False)

    asyncio.run(body())
