"""The asyncio client: pipelined requests over one connection."""

from __future__ import annotations

import asyncio
import itertools
import ssl as ssl_module
from typing import Any

from rankd import __version__, wire
from rankd.client._operations import Operations
from rankd.client.errors import (
    ConnectionLost,
    InvalidInput,
    Moved,
    NotPrimary,
    ProtocolError,
    RankdError,
    RequestTimeout,
    Unavailable,
    error_for,
)
from rankd.engine.groups import group_of

#: Reads that take ``min_seq`` (on a cluster: answer once that write is applied).
CONSISTENT_READS = frozenset({"get_board", "top", "member", "around", "ranks"})


class _Connection(asyncio.Protocol):
    """One TCP connection: writes request frames, resolves futures by id."""

    def __init__(self, max_frame: int) -> None:
        self.decoder = wire.FrameDecoder(max_frame)
        self.pending: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None
        self.lost: RankdError | None = None
        self.can_write = asyncio.Event()
        self.can_write.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.decoder.feed(data)
        except wire.FrameError as exc:
            self._deliver(exc.decoded)
            self._fail_all(ProtocolError(f"undecodable answer from the server: {exc.message}"))
            self.transport.abort()
            return
        self._deliver(messages)

    def _deliver(self, messages: list[Any]) -> None:
        try:
            for message in messages:
                request_id, ok, body = wire.parse_response(message)
                if request_id == 0:  # the server gave up on the stream
                    self._fail_all(error_for(body["code"], body["message"]))
                    self.transport.close()
                    return
                future = self.pending.pop(request_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(body)
                    else:
                        future.set_exception(error_for(body["code"], body["message"], body))
        except wire.FrameError as exc:
            self._fail_all(ProtocolError(f"undecodable answer from the server: {exc.message}"))
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(ConnectionLost(f"connection to rankd lost ({exc or 'closed'})"))
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def _fail_all(self, error: RankdError) -> None:
        if self.lost is None:
            self.lost = error
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


class AsyncClient(Operations):
    """asyncio client for rankd's TCP protocol (see :mod:`rankd.client`).

    ``timeout`` bounds each call; ``retries`` is how many times a call that
    may be retried is sent again after a lost connection, with exponential
    backoff from ``backoff`` seconds up to ``max_backoff``.  A call refused
    ``not_primary`` (no live node writes its group just now: nothing was
    applied) is sent again likewise, whether or not it may be retried.

    On a cluster, a write sent to a node that does not write its board's
    group is answered ``moved`` with the node that does; with
    ``follow_moved`` (the default) the client sends it there, over a
    connection of its own to that node kept for later writes, and returns
    that answer (one hop: a second ``moved`` raises :class:`Moved`).
    ``submit_many`` sends each moved event on likewise.  It follows only
    what its own node answers (the node names only nodes the cluster
    vouches for: docs/cluster.md, Trust), and only one hop.  It keeps what
    ``moved`` answers said (:attr:`routes`: each group's node, the newest
    topology epoch winning), so its next requests of a board of that group
    go to that node directly, each node's over one pipelined connection, and
    a ``submit_many`` is split by node up front, its answers put back in
    the order of its events.  A node sent to directly that answers ``moved``
    in turn (the group moved on) updates the map, and the request goes the
    first node's way again.

    With ``read_your_writes`` (the default: session consistency) the client
    keeps, per board, the log position ``(epoch, seq)`` of its last write
    (:attr:`positions`), and each read of that board it sends without a
    ``min_seq`` carries that position as ``min_seq``: on a cluster a read
    served by a follower then waits until the follower applied the write.
    On a single node answers carry no position and nothing is sent.

    With ``out_of_order`` (the default) the client asks each node in its
    hello to answer its submits as each one's board group commits rather
    than in request order (it matches answers by id anyway): on a cluster,
    the callers sharing a connection then do not wait for each other's
    slowest group.  A server too old to know the option refuses that hello
    (``invalid``); the client then connects again with a plain one.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 7701, *, timeout: float = 10.0,
                 connect_timeout: float = 5.0, retries: int = 5, backoff: float = 0.05,
                 max_backoff: float = 2.0, client_name: str = f"rankd-python/{__version__}",
                 max_frame: int = wire.MAX_FRAME, token: str | None = None,
                 ssl: ssl_module.SSLContext | None = None, follow_moved: bool = True,
                 read_your_writes: bool = True, out_of_order: bool = True) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.client_name = client_name
        self.max_frame = max_frame
        #: A JWT or API key, sent in an auth request after hello.
        self.token = token
        self.ssl = ssl
        self.follow_moved = follow_moved
        self.read_your_writes = read_your_writes
        #: Ask for answers in any order (see above); cleared when the server refused it.
        self.out_of_order = out_of_order
        #: Board -> (epoch, seq) of the last write this client made to it.
        self.positions: dict[str, tuple[int, int]] = {}
        #: Connections to the other cluster nodes ``moved`` answers named.
        self._peers: dict[str, AsyncClient] = {}
        #: Group -> (topology epoch, TCP address) of the node that writes it,
        #: as ``moved`` answers said (the slot map, learnt).
        self.routes: dict[int, tuple[int, str]] = {}
        self.principal: dict[str, Any] | None = None
        self.server_info: dict[str, Any] | None = None
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._ids = itertools.cycle(range(1, wire.MAX_ID + 1))
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect and say hello (done lazily by the first call otherwise)."""
        await self._connected()

    async def close(self) -> None:
        self._closed = True
        peers, self._peers = self._peers, {}
        for peer in peers.values():
            await peer.close()
        connection, self._connection = self._connection, None
        if connection is not None and connection.transport is not None:
            connection.transport.close()

    async def _connected(self) -> _Connection:
        connection = self._connection
        if connection is not None and connection.lost is None:
            return connection
        if self._closed:
            raise ConnectionLost("the client was closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self.max_frame), self.host,
                                       self.port, ssl=self.ssl), self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to rankd at {self.host}:{self.port}: "
                                 f"{exc}") from exc
        hello = {"version": wire.VERSION, "client": self.client_name}
        if self.out_of_order:
            hello["out_of_order"] = True
        try:
            self.server_info = await self._send(connection, "hello", hello)
        except InvalidInput:
            if not self.out_of_order:
                raise
            # A server from before the option: it closed; a plain hello, anew.
            self.out_of_order = False
            return await self._open()
        if self.token is not None:
            self.principal = await self._send(connection, "auth", {"token": self.token})
        self._connection = connection
        return connection

    async def _send(self, connection: _Connection, op: str, args: dict[str, Any]) -> Any:
        if connection.lost is not None:
            raise connection.lost
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        connection.pending[request_id] = future
        try:
            frame = wire.request(request_id, op, args)
        except ValueError as exc:
            connection.pending.pop(request_id, None)
            raise error_for("too_large", str(exc)) from None
        connection.transport.write(frame)
        if not connection.can_write.is_set():
            await connection.can_write.wait()
        # A timer rather than wait_for: no extra task per request.
        timer = asyncio.get_running_loop().call_later(
            self.timeout, _expire, connection, request_id, op, self.timeout)
        try:
            return await future
        finally:
            timer.cancel()

    async def _call(self, op: str, args: dict[str, Any], idempotent: bool) -> Any:
        if not self.read_your_writes:
            return await self._attempts(op, args, idempotent)
        if op in CONSISTENT_READS and "min_seq" not in args:
            position = self.positions.get(args.get("board"))  # type: ignore[arg-type]
            if position is not None:
                args = {**args, "min_seq": position[1]}
        result = await self._attempts(op, args, idempotent)
        if op == "submit_many":
            for event, answer in zip(args["events"], result.get("results", ()), strict=False):
                self._remember(event.get("board"), answer)
        else:
            self._remember(args.get("board"), result)
        return result

    def _remember(self, board: object, answer: object) -> None:
        """Keep the position a write's ``answer`` gives (if any) as ``board``'s."""
        if not isinstance(board, str) or not isinstance(answer, dict):
            return
        seq, epoch = answer.get("seq"), answer.get("epoch")
        if type(seq) is int and type(epoch) is int:
            known = self.positions.get(board)
            if known is None or seq > known[1]:
                self.positions[board] = (epoch, seq)

    def _learn(self, moved: Moved | dict[str, Any]) -> None:
        """Keep the route a ``moved`` answer gives, unless one of a newer epoch is known."""
        if isinstance(moved, Moved):
            group, epoch, address = moved.group, moved.epoch, moved.address
        else:
            group, epoch, address = moved.get("group"), moved.get("epoch"), moved.get("address")
        if type(group) is not int or type(epoch) is not int or not address:
            return
        known = self.routes.get(group)
        if known is None or epoch >= known[0]:
            self.routes[group] = (epoch, address)

    def _route(self, board: object) -> str | None:
        """The address of the node known to write ``board``'s group, if not this one."""
        if not self.routes or not isinstance(board, str):
            return None
        known = self.routes.get(group_of(board))
        return known[1] if known is not None and known[1] != self._address else None

    @property
    def _address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _attempts(self, op: str, args: dict[str, Any], idempotent: bool) -> Any:
        """Send ``op`` to the node known to write its board (see :class:`AsyncClient`),
        else to this one, retried as :class:`AsyncClient` says, following ``moved``."""
        if self.follow_moved and op == "submit_many" and self.routes:
            return await self._submit_split(args, idempotent)
        address = self._route(args.get("board")) if self.follow_moved else None
        if address is not None:
            try:
                return await self._peer(address)._attempts(op, args, idempotent)
            except Moved as moved:  # it moved on: learn, and go this node's way
                self._learn(moved)
                group = group_of(args["board"])
                if self.routes.get(group, (0, None))[1] == address:
                    del self.routes[group]  # (an answer without its new place)
            except ConnectionLost:
                self.routes = {g: r for g, r in self.routes.items() if r[1] != address}
        return await self._own_attempts(op, args, idempotent)

    async def _submit_split(self, args: dict[str, Any], idempotent: bool) -> dict[str, Any]:
        """``submit_many`` split by the node known to write each event's board
        (the rest to this node), sent at once, answered in the events' order."""
        events = args["events"]
        by_node: dict[str | None, list[int]] = {}
        for position, event in enumerate(events):
            board = event.get("board") if isinstance(event, dict) else None
            by_node.setdefault(self._route(board), []).append(position)
        if list(by_node) == [None]:
            return await self._own_attempts("submit_many", args, idempotent)
        results: list[Any] = [None] * len(events)

        async def send(address: str | None, positions: list[int]) -> None:
            batch = {**args, "events": [events[p] for p in positions]}
            ids = all(isinstance(events[p], dict) and events[p].get("event_id") is not None
                      for p in positions)
            if address is not None:
                answer = await self._peer(address)._attempts("submit_many", batch, ids)
                # Events whose group moved on meanwhile: this node's way.
                again = [i for i, result in enumerate(answer["results"])
                         if isinstance(result, dict) and (result.get("error") or {}).get(
                             "code") == "moved"]
                for i in again:
                    self._learn(answer["results"][i]["error"])
                if again:
                    retry = await self._own_attempts(
                        "submit_many", {**args, "events": [batch["events"][i] for i in again]},
                        ids)
                    for i, result in zip(again, retry["results"], strict=True):
                        answer["results"][i] = result
            else:
                answer = await self._own_attempts("submit_many", batch, idempotent and ids)
            for position, result in zip(positions, answer["results"], strict=True):
                results[position] = result

        await asyncio.gather(*(send(address, positions)
                               for address, positions in by_node.items()))
        return {"results": results}

    async def _own_attempts(self, op: str, args: dict[str, Any], idempotent: bool) -> Any:
        """Send ``op`` to this client's node, retried, following ``moved`` one hop."""
        delay = self.backoff
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                connection = await self._connected()
            except ConnectionLost:
                if last:
                    raise
            else:
                try:
                    result = await self._send(connection, op, args)
                except Moved as moved:
                    if not self.follow_moved or not moved.address:
                        raise
                    self._learn(moved)
                    return await self._peer(moved.address)._own_attempts(op, args, idempotent)
                except NotPrimary:
                    # Refused before anything applied (no live node writes the
                    # group just now): sending it again is always safe.
                    if last:
                        raise
                except (ConnectionLost, Unavailable):
                    # Sent: retrying is only safe when applying twice is harmless.
                    if last or not idempotent:
                        raise
                    if self._connection is connection:
                        self._connection = None
                else:
                    if op == "submit_many" and self.follow_moved:
                        await self._send_moved_on(args["events"], result["results"])
                    return result
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)
        raise AssertionError("unreachable")

    def _peer(self, address: str) -> AsyncClient:
        peer = self._peers.get(address)
        if peer is None:
            host, _, port = address.rpartition(":")
            peer = self._peers[address] = AsyncClient(
                host.strip("[]"), int(port), timeout=self.timeout,
                connect_timeout=self.connect_timeout, retries=self.retries,
                backoff=self.backoff, max_backoff=self.max_backoff,
                client_name=self.client_name, max_frame=self.max_frame, token=self.token,
                ssl=self.ssl, follow_moved=False, read_your_writes=False,
                out_of_order=self.out_of_order)
        return peer

    async def _send_moved_on(self, events: list[dict[str, Any]],
                             results: list[dict[str, Any]]) -> None:
        """Send the events of a ``submit_many`` answered ``moved`` to the
        nodes named, and put their answers in their places."""
        moved: dict[str, list[int]] = {}
        for position, result in enumerate(results):
            error = result.get("error") if isinstance(result, dict) else None
            if error is not None and error.get("code") == "moved" and error.get("address"):
                moved.setdefault(error["address"], []).append(position)
                self._learn(error)
        for address, positions in moved.items():
            batch = [events[p] for p in positions]
            idempotent = all(event.get("event_id") is not None for event in batch)
            answer = await self._peer(address)._own_attempts("submit_many", {"events": batch},
                                                             idempotent)
            for position, result in zip(positions, answer["results"], strict=True):
                results[position] = result


def _expire(connection: _Connection, request_id: int, op: str, timeout: float) -> None:
    future = connection.pending.pop(request_id, None)
    if future is not None and not future.done():
        future.set_exception(RequestTimeout(f"{op}: no answer within {timeout}s"))
