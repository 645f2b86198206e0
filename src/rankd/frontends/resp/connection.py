"""The RESP listener and its connections.

One :class:`RespConnection` (an ``asyncio.Protocol``) per client.  Bytes are
split into commands by :class:`~.protocol.RequestReader`; commands queue
up and one worker task per connection answers them in order.  Reads are
answered at once; consecutive ``ZADD``/``ZINCRBY`` commands of a pipeline
go to the engine as one batch (one WAL append, one commit) and are
answered once it is applied, so a read pipelined after them sees them.
Pops are applied as they are read and answered with that commit: a run
of plain ones natively (:mod:`.pop_lane`), others of one board as one
removal (:mod:`.pop_runs`).

Every command passes the same :class:`~rankd.security.Gate` as REST and
TCP, under the operation it amounts to (``submit``, ``top``,
``delete_board``...): the same scopes and rate limits.  With credentials
configured a connection must ``AUTH`` (or ``HELLO ... AUTH``) within
:data:`HANDSHAKE_SECONDS`, with requests of at most
:data:`HANDSHAKE_MAX_BULK` bytes and :data:`HANDSHAKE_MAX_WORDS` words until
then, and only the handshake commands (:data:`HANDSHAKE_COMMANDS`) run:
anything else answers ``NOAUTH`` and counts as a failure; repeated failures
close it.  The connection caps of ``ConnectionLimits`` and the idle timeout
apply as on TCP.

What a connection holds is bounded in bytes, before and after AUTH: one
request by ``--max-request-bytes`` (:class:`RequestReader`; a large one is
vetted from its command name before more of it is read), requests queued
for the worker by :data:`QUEUE_HIGH_BYTES` (reading pauses above it until
they drain), and replies by the transport's back-pressure: answering waits
while the client does not read, and a client that does not read for the
idle timeout (at most ``OUTPUT_STALL_SECONDS``) is dropped.  Every command,
those open to all included, is charged to a rate-limit bucket.

A client that closes (or half-closes) after pipelining gets every command
received before its EOF run, in order, as Redis runs them
(:mod:`rankd.frontends.peer_end`); a blocking pop that would wait then is
dropped with what follows it (:meth:`RespConnection.freed`), as Redis frees
such a client.  A batch of the worker ends after :data:`BATCH_SECONDS` of
work, so a long pipeline leaves the loop to others between batches.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import ssl as ssl_module
import time
from typing import TYPE_CHECKING, Any

from rankd._native import native_or
from rankd.engine.engine import SETTLE_TRIES
from rankd.engine.errors import EngineError, Unsettled
from rankd.frontends import gone_work
from rankd.frontends.connections import (
    BATCH_SECONDS,
    HANDSHAKE_SECONDS,
    ConnectionLimits,
    PipelinedConnection,
    PipelinedServer,
)
from rankd.frontends.resp import cluster_commands, monitor, pop_lane, pop_runs, transactions
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.commands import COMMANDS, lookup, unknown_command
from rankd.frontends.resp.context import (
    FAST_WRITES,  # (also read from here by tests)
    NOAUTH,
    Applied,
    Command,
    Multi,
    Writes,
    endpoint,
    error_text,
)
from rankd.frontends.resp.protocol import (
    MAX_REQUEST,
    OUT_HIGH_WATER,
    ProtocolError,
    Replies,
    RequestReader,
    RequestRefused,
)
from rankd.frontends.resp.sorted_sets import MAX_REPLY_ENTRIES, REDIS_BOARD_DICT, incremented
from rankd.frontends.service import MAX_BATCH
from rankd.security import ANONYMOUS_ALL, Gate, Principal
from rankd.watchdog import ACTIVITY

if TYPE_CHECKING:
    from collections.abc import Callable

    from rankd.frontends.service import Service

log = logging.getLogger(__name__)

#: Requests queued for the worker (by count, and by the bytes they hold)
#: past which the connection stops reading until they drain to the low marks.
QUEUE_HIGH_WATER = 4096
QUEUE_LOW_WATER = 512
QUEUE_HIGH_BYTES = 4 << 20
QUEUE_LOW_BYTES = 1 << 20
#: Before AUTH only a handshake is legitimate: a few hundred bytes.
HANDSHAKE_QUEUE_BYTES = 64 * 1024
#: What a queued request holds besides its bytes: the list and one bytes
#: object per word (a 6-byte PING is ~110 bytes of Python objects).
REQUEST_OVERHEAD = 64
WORD_OVERHEAD = 40
#: A packed run's requests, each (its spans, its result, its share of the read).
PACKED_REQUEST_BYTES = 128
MAX_AUTH_FAILURES = 3
#: Before AUTH: the largest request (all its words) and the most words in one.
HANDSHAKE_MAX_BULK = 16 * 1024
HANDSHAKE_MAX_WORDS = 16
#: The commands that run before AUTH; any other answers NOAUTH and counts
#: as a failed attempt.
HANDSHAKE_COMMANDS = frozenset({"auth", "hello", "ping", "quit", "reset"})
EXPIRED = "ERR the credential this connection authenticated with has expired; closing"
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."

_client_ids = itertools.count(1)
_Packed, _ = native_or("rankd.engine._packed", "Packed", None)
_PackedReads, _ = native_or("rankd.engine._packed", "PackedReads", None)
_PackedPops = pop_lane.PackedPops
#: What the scanner packs: runs of plain writes, reads and pops.
_PACKED = (_Packed, _PackedReads, _PackedPops)
_encode_replies, _ = native_or("rankd.frontends.resp._scanner", "encode_replies", None)


class _GeneralLane:
    """``_lanes.RespLane`` where it is not built: every read goes the
    general way."""

    def data_received(self, data: bytes) -> None:
        self._data_received(data)  # type: ignore[attr-defined]

    def _encoded(self, packed: Any) -> bytes:
        """The replies of an applied packed run (and its statistics)."""
        data, answered = _encode_replies(packed, self.replies.version,  # type: ignore
                                         self._packed_reply)  # type: ignore[attr-defined]
        self.server.stats[("write", "ok")] += answered  # type: ignore[attr-defined]
        return data


#: The first base of RespConnection: its hot path, natively when built.
_Lane, _ = native_or("rankd.frontends._lanes", "RespLane", _GeneralLane)


def weight(item: Any) -> int:
    """Bytes a queued request holds, roughly (see :data:`REQUEST_OVERHEAD`)."""
    if type(item) is list:
        return REQUEST_OVERHEAD + sum(map(len, item)) + WORD_OVERHEAD * len(item)
    if isinstance(item, ProtocolError):
        return REQUEST_OVERHEAD
    return PACKED_REQUEST_BYTES * len(item)


def _grown(out: list[bytes], size: list[int]) -> int:
    """Bytes in ``out``, counted on from ``size`` (``[replies counted,
    bytes]``, updated): no rescan of what was counted."""
    counted, total = size
    while counted < len(out):
        total += len(out[counted])
        counted += 1
    size[0], size[1] = counted, total
    return total


class RespConnection(_Lane, PipelinedConnection):  # type: ignore[valid-type, misc]
    """One client connection."""

    def __init__(self, server: RespServer) -> None:
        super().__init__(server)
        self.service: Service = server.service
        self.gate = server.gate
        self.id = next(_client_ids)
        self.replies = Replies(2)
        #: Who is calling: set by AUTH/HELLO (or everyone, without credentials configured).
        self.principal: Principal | None = None if self.gate.auth_enabled else ANONYMOUS_ALL
        self.auth_failures = 0
        self.name: str | None = None
        self.library: dict[str, str] = {}
        #: The window and period reads use (``RANKD.WINDOW``); None: the board's own.
        self.window: str | None = None
        self.period: str | None = None
        self.reader = self._reader()
        #: Whether the reader packs runs of plain requests (once authenticated).
        #: On a cluster node a run of writes is taken only if its boards are of
        #: one group the node writes now (``_takes``); the others go the general
        #: way, which answers TRYAGAIN.
        self.packs = FAST_WRITES and not server.monitors  # (a monitor sees every command)
        #: On a cluster node packed reads are routed by slot (``_reads``).
        self.routed = server.service.topology is not None
        self.queue: collections.deque[Any] = collections.deque()
        #: What the queued requests hold (:func:`weight`).
        self.queued_bytes = 0
        #: Reading waits for the reader to read on what it holds (``_parse_more``).
        self.parse_paused = False
        #: Set by QUIT: close once its reply is written.
        self.quitting = False
        #: The transaction being queued (MULTI), and the watched boards
        #: (WATCH): see :mod:`.transactions`.
        self.multi: Multi | None = None
        self.watched: dict[str, Any] | None = None
        #: Ends the blocking pop this connection waits in, if any (:mod:`.blocking`).
        self.unblock: Callable[[], None] | None = None
        #: On a cluster node: what the client said of itself (:mod:`.cluster_commands`).
        self.cluster_session: cluster_commands.ClusterSession | None = None

    def _reader(self) -> RequestReader:
        if self.principal is None:
            return RequestReader(max_bulk=HANDSHAKE_MAX_BULK, max_multibulk=HANDSHAKE_MAX_WORDS,
                                 max_request=HANDSHAKE_MAX_BULK)
        return RequestReader(max_bulk=self.server.max_bulk, max_request=self.server.max_request,
                             vet=self._vet)

    def _vet(self, name: bytes) -> None:
        """Refuse a large request from its command name, before more of it
        is read: an unknown command, or one the caller may not run."""
        command = COMMANDS.get(name.lower())
        if command is None:
            self.server.stats[("unknown", "error")] += 1
            raise RequestRefused(unknown_command([name]))
        if command.operation is not None:
            try:
                self.gate.admit(self.principal or ANONYMOUS_ALL, command.operation,
                                self.address, 0)
            except EngineError as exc:
                self.server.stats[(command.name, exc.code)] += 1
                raise RequestRefused(error_text(exc)) from None

    # --- asyncio.Protocol ---------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        self.close_with(f"ERR max number of clients reached ({reason})")

    def _forget(self) -> None:
        if self.unblock is not None:  # a blocked pop leaves at once, not at its timeout
            self.unblock()
        self.queue.clear()
        self.queued_bytes = 0
        monitor.detach(self)
        if self.cluster_session is not None and self.cluster_session.relay is not None:
            self.cluster_session.relay.close()

    def _has_work(self) -> bool:
        return self.parse_paused or super()._has_work()

    def _ended(self) -> None:
        if self.unblock is not None:  # a blocked pop meets the EOF: see ``freed``
            self.unblock()

    def freed(self) -> None:
        """A blocking pop that would wait met the client's EOF: as Redis
        frees such a client, the pop and all sent after it are dropped
        (the replies before it are written on a half-close)."""
        self.queue.clear()
        self.queued_bytes = 0
        self.reader = self._reader()  # (what it buffered, too)

    def _data_received(self, data: bytes) -> None:
        """``data_received`` the general way (the lane's, for what it does not take)."""
        if self.closing:
            return
        self.last_active = self.loop.time()
        reader = self.reader
        reader.pack = self.packs and self.principal is not None
        try:
            items = reader.feed(data)
        except ProtocolError as exc:
            items = [*exc.commands, exc]
            self.transport.pause_reading()
        else:
            if reader.more and not self.parse_paused:
                # The reader stopped at FEED_MOST commands: the rest is read
                # on the loop's next turn, and nothing more until then.
                self.parse_paused = True
                self.transport.pause_reading()
                self.loop.call_soon(self._parse_more)
        if self.worker is None and not self.queue and not self.answering and self.writable:
            item = items[0] if len(items) == 1 else None
            if type(item) is _Packed:  # an unpipelined client's write: straight there
                if self._takes(item):
                    self._hand_over(item)
                    return
                items = self._unpack(item)  # each write admitted alone, by the worker
            elif type(item) is _PackedReads:  # or read
                out: list[bytes] = []
                items = self._reads(item, out)  # (what is left waits for the client)
                if out:
                    self.transport.writelines(out)
            else:
                items = self._answer_now(items)
            if not items:
                return
        self._queue_items(items)

    def _parse_more(self) -> None:
        """Read on the commands a ``feed`` left buffered."""
        self.parse_paused = False
        if self.closing:
            return
        self._data_received(b"")
        if not (self.parse_paused or self.reading_paused or self.closing):
            self.transport.resume_reading()
        self._finish()  # (after the client's EOF: once all it sent is answered)

    def _queue_items(self, items: list[Any]) -> None:
        """Queue requests for the worker, which answers them in order."""
        self.queue.extend(items)
        self.queued_bytes += sum(map(weight, items))
        if not self.reading_paused and (
                len(self.queue) >= QUEUE_HIGH_WATER or self.queued_bytes >= (
                    QUEUE_HIGH_BYTES if self.principal is not None else HANDSHAKE_QUEUE_BYTES)):
            self.transport.pause_reading()
            self.reading_paused = True
        if self.worker is None and self.queue:
            self.worker = self.loop.create_task(self._drain())

    # --- answering ---------------------------------------------------------------------

    def _answer_now(self, items: list[Any]) -> list[Any]:
        """Answer, right here, the leading commands that need no waiting
        (reads, the connection's own), and hand the first run of plain
        writes to the engine (answered when committed, by ``_applied``); no
        task is made for them.  Returns the items left for the worker."""
        out: list[bytes] = []
        size = [0, 0]
        position = 0
        for item in items:
            if self.multi is not None and type(item) in _PACKED:
                items[position:position + 1] = self._unpack(item)
                break  # inside MULTI every command is queued as words (the worker's)
            if type(item) is _Packed:
                if not (self.writable and self._takes(item)):
                    items[position:position + 1] = self._unpack(item)
                    break
                if out:
                    self.transport.writelines(out)
                    out = []
                self._hand_over(item)
                position += 1
                break  # what follows must see it applied: the worker waits for it
            if type(item) is _PackedPops:
                break  # applied now, acknowledged once committed: the worker's
            if type(item) is _PackedReads:
                rest = self._reads(item, out)
                position += 1
                if rest:
                    items[position:position] = rest
                    break
                if _grown(out, size) >= OUT_HIGH_WATER:
                    break  # the rest waits for the client to read (the worker)
                continue
            if isinstance(item, ProtocolError):
                break
            command = self._lookup(item, out)
            if command is not None and self.multi is not None and transactions.queue(
                    self, command, item, out, weight(item)):
                pass
            elif command is not None:
                if not command.immediate:
                    break
                try:
                    self._run_now(command, item, out)
                except Unsettled:
                    break  # it waits for writes to commit: the worker's
            position += 1
            if _grown(out, size) >= OUT_HIGH_WATER or position >= QUEUE_LOW_WATER:
                break  # the rest waits for the client to read, or its turn (the worker)
            if self.closing:
                return []
        if out:
            self.transport.writelines(out)
        return items[position:]

    async def _drain(self) -> None:
        try:
            while self.queue and not self.closing:
                await self.answered()  # runs handed over earlier are answered first
                out: list[bytes] = []
                pending: list[tuple[int, Writes | Applied]] = []
                size = [0, 0]
                until = time.perf_counter() + BATCH_SECONDS
                while (self.queue and not self.closing and len(out) < QUEUE_LOW_WATER
                       and _grown(out, size) < OUT_HIGH_WATER and time.perf_counter() < until):
                    words = self.queue.popleft()
                    self.queued_bytes -= weight(words)
                    if self.gone and self.multi is None and (type(words) is _PackedReads or (
                            gone_work.resp_read_only(words, COMMANDS))):
                        continue  # nobody reads its reply: no effect to keep
                    if self.multi is not None and type(words) in _PACKED:
                        unpacked = self._unpack(words)  # inside MULTI: queued as words
                        self.queue.extendleft(reversed(unpacked))
                        self.queued_bytes += sum(map(weight, unpacked))
                        continue
                    if type(words) is _Packed:
                        await self._flush(pending, out)
                        await self._packed(words, out)
                        continue
                    if type(words) is _PackedReads:
                        await self._flush(pending, out)
                        rest = self._reads(words, out)
                        self.queue.extendleft(reversed(rest))
                        self.queued_bytes += sum(map(weight, rest))
                        if rest:
                            break
                        continue
                    if type(words) is _PackedPops:
                        if pending and type(pending[-1][1]) is Writes:
                            await self._flush(pending, out)  # they must see them applied
                        rest = pop_lane.answer(self, words, out, pending)
                        self.queue.extendleft(reversed(rest))
                        self.queued_bytes += sum(map(weight, rest))
                        if rest and rest[0] is words:
                            break  # (the rest in the next batch: others run between)
                        continue
                    if isinstance(words, ProtocolError):
                        await self._flush(pending, out)
                        out.append(words.reply())
                        self.close_with(None, out)
                        return
                    # (A monitor sees each pop: runs go the general way then.)
                    if (not self.server.monitors and pop_runs.highest(words) is not None
                            and await self._pop_run(words, out, pending)):
                        continue
                    await self._one(words, out, pending)
                await self._flush(pending, out)
                if out and not self.closing:
                    self.transport.writelines(out)
                if (self.reading_paused and len(self.queue) <= QUEUE_LOW_WATER
                        and self.queued_bytes <= QUEUE_LOW_BYTES and not self.closing):
                    self.reading_paused = False
                    if not self.parse_paused:
                        self.transport.resume_reading()
                await self.can_write.wait()
                # Let the loop run others between batches: a queue of a
                # hundred thousand cheap commands is answered a batch a turn.
                await asyncio.sleep(0)
        except Exception:  # one connection's bug must not go unnoticed or hurt others
            log.exception("RESP connection failed; closing it")
            self.transport.abort()
        finally:
            self.worker = None
            self._finish()

    async def _pop_run(self, words: list[bytes], out: list[bytes],
                       pending: list[tuple[int, Writes | Applied]]) -> bool:
        """A ZPOPMIN/ZPOPMAX and the pops on its board queued right behind
        it, answered as one removal (:mod:`.pop_runs`) if they can be."""
        if pending and type(pending[-1][1]) is Writes:
            await self._flush(pending, out)  # they must see them applied
        answered = pop_runs.answer_run(self, words, out, pending)
        for _ in range(answered - 1):
            self.queued_bytes -= weight(self.queue.popleft())
        return answered > 0

    def _lookup(self, words: list[bytes], out: list[bytes]) -> Command | None:
        """The command ``words`` call, or None with its error in ``out``."""
        try:
            command = lookup(words)
            if self.service.topology is not None and self.principal is not None:
                command = cluster_commands.route(self, command, words)  # by slot
        except CommandError as exc:
            # Only known commands name a metrics series: a client can send
            # any number of names.
            known = COMMANDS.get(words[0].lower())
            self.server.stats[(known.name if known is not None else "unknown", "error")] += 1
            # (Inside MULTI, EXEC aborts.)
            out.append(self.replies.error(transactions.rejected(self, words, exc.text)))
            if self.principal is None:
                self._failed_auth(out)
            return None
        ACTIVITY.frontend = "resp"  # who holds the loop, for the loop watchdog
        ACTIVITY.command = command.name
        return command

    def _run_now(self, command: Command, words: list[bytes], out: list[bytes]) -> None:
        """Answer a command that needs no waiting (``Command.immediate``)."""
        admitted = False
        try:
            self._admit(command, words)
            admitted = True
            out.append(command.handler(self, words))
            if self.quitting:  # QUIT: what came before, its +OK, then close
                self.close_with(None, out)
                self._monitored(command, words, out)
                return
        except CommandError as exc:
            self.server.stats[(command.name, "error")] += 1
            out.append(self.replies.error(exc.text))
            if exc.text == NOAUTH:
                self._failed_auth(out)
            if admitted:
                self._monitored(command, words, out)
            return
        except Unsettled:
            raise  # (the caller has it answered once the writes it meets commit)
        except EngineError as exc:
            self.server.stats[(command.name, exc.code)] += 1
            out.append(self.replies.error(error_text(exc)))
            if admitted:
                self._monitored(command, words, out)
            return
        self.server.stats[(command.name, "ok")] += 1
        self._monitored(command, words, out)

    def _monitored(self, command: Command, words: list[bytes], out: list[bytes]) -> None:
        """Show a command that ran to the monitors, if any (:mod:`.monitor`)."""
        if self.server.monitors:
            monitor.feed(self, command, words, out)

    async def _run_settled(self, command: Command, words: list[bytes], out: list[bytes],
                           unsettled: Unsettled) -> None:
        """``_run_now`` of a read that met writes its cluster primary (this
        node) applied and the cluster's log has not committed yet: made
        again once they are (``Engine.settle``), a few times at most."""
        for _ in range(SETTLE_TRIES - 1):
            try:
                await self.service.engine.settle(unsettled.group)
                self._run_now(command, words, out)
                return
            except Unsettled as again:
                unsettled = again
            except EngineError as exc:
                self.server.stats[(command.name, exc.code)] += 1
                out.append(self.replies.error(error_text(exc)))
                return
        self.server.stats[(command.name, unsettled.code)] += 1
        out.append(self.replies.error(error_text(unsettled)))

    async def _one(self, words: list[bytes], out: list[bytes],
                   pending: list[tuple[int, Writes | Applied]]) -> None:
        """Answer one command into ``out`` (or queue its writes in ``pending``)."""
        stats = self.server.stats
        command = self._lookup(words, out)
        if command is None:
            return
        if self.multi is not None and transactions.queue(self, command, words, out,
                                                         weight(words)):
            return
        if command.applied_now:
            if pending and type(pending[-1][1]) is Writes:
                await self._flush(pending, out)  # it must see them applied
        elif not command.batchable:
            await self._flush(pending, out)
        if command.immediate:
            try:
                self._run_now(command, words, out)
            except Unsettled as exc:
                await self._flush(pending, out)  # (what it reads comes after them)
                await self._run_settled(command, words, out, exc)
            return
        admitted = shown = False
        try:
            self._admit(command, words)
            admitted = True
            try:
                result = command.handler(self, words)
            except Unsettled:  # a read of writes not committed yet: once they are
                await self._flush(pending, out)
                result = await self.service.engine.settled_read(
                    functools.partial(command.handler, self, words))
            # Shown once it has run (a blocking pop once it waits), as Redis
            # shows it; EXEC after the commands it runs; a write routed
            # once the group's register is read, once it is routed here.
            routes_first = command.shown_once_routed
            if command.name != "exec" and not routes_first:
                shown = True
                self._monitored(command, words, out)
            if not isinstance(result, bytes | Writes | Applied):
                await self._flush(pending, out)
                result = await result  # (bytes, or writes it decided on: see cluster routing)
            if routes_first:
                shown = True
                self._monitored(command, words, out)
            if isinstance(result, Writes):
                if sum(len(w.submissions) for _, w in pending if type(w) is Writes) \
                        + len(result.submissions) > MAX_BATCH:
                    await self._flush(pending, out)
                pending.append((len(out), result))
                out.append(b"")
                stats[(command.name, "ok")] += 1
                return
            if type(result) is Applied:  # its reply waits for its commit (see .pop_runs)
                pending.append((len(out), result))
                out.append(result.reply)
                stats[(command.name, "ok")] += 1
                return
        except CommandError as exc:
            stats[(command.name, "error")] += 1
            out.append(self.replies.error(exc.text))
            if exc.text == NOAUTH:
                self._failed_auth(out)
            if admitted and not shown and not isinstance(exc, cluster_commands.Rerouted):
                self._monitored(command, words, out)
            return
        except EngineError as exc:
            stats[(command.name, exc.code)] += 1
            out.append(self.replies.error(error_text(exc)))
            if admitted and not shown:
                self._monitored(command, words, out)
            return
        stats[(command.name, "ok")] += 1
        out.append(result)
        if not shown:
            self._monitored(command, words, out)

    async def _packed(self, packed: Any, out: list[bytes]) -> None:
        """A run of plain writes the scanner packed: applied by the engine's
        native ingest and answered by the native encoder, or, if the fast
        path does not take it, handed back to the general path command by
        command (both answer alike)."""
        if not self._takes(packed):
            unpacked = self._unpack(packed)
            self.queue.extendleft(reversed(unpacked))
            self.queued_bytes += sum(map(weight, unpacked))
            return
        try:
            await self.service.submit_packed(packed)
        except EngineError as exc:  # e.g. read-only: every write gets the error
            packed.answers = [exc] * len(packed)
        out.append(self._encoded(packed))

    def _reads(self, reads: Any, out: list[bytes]) -> list[list[bytes]]:
        """A run of plain reads the scanner packed, answered by the engine
        natively; a read it leaves (and every one, if the connection reads
        another window or the run is not admitted whole) the general way.
        Once :data:`OUT_HIGH_WATER` bytes of replies are made, the reads
        left are returned as commands, for the worker (which waits while
        the client does not read)."""
        native = (self.window is None and self.period is None and self.principal is not None
                  and not self.server.monitors)  # (a monitor sees each read: the general way)
        if native and self.service.topology is not None:  # keys of other nodes: routed
            native = cluster_commands.serves_reads(self, reads)
        if native and (charge := self._charger("top")) is not None:
            try:
                charge(len(reads))
            except EngineError:
                native = False  # each read is admitted (or refused) alone
        if not native:
            return self._read_generally(reads, range(len(reads)), out)
        return self._answer_reads(reads, out)

    def _answer_reads(self, reads: Any, out: list[bytes]) -> list[list[bytes]]:
        """``_reads`` once the run is admitted."""
        first = 0
        while first < len(reads):
            data, stopped = self.service.plain_reads.answer(
                reads, first, self.replies.version, MAX_REPLY_ENTRIES, OUT_HIGH_WATER)
            if data:
                out.append(data)
            self.server.stats[("read", "ok")] += stopped - first
            if stopped >= len(reads):
                return []
            if len(data) >= OUT_HIGH_WATER:
                reader = RequestReader(max_bulk=self.server.max_bulk)
                return [words for i in range(stopped, len(reads))
                        for words in reader.feed(reads.source(i))]
            if rest := self._read_generally(reads, range(stopped, len(reads)), out, 1):
                return rest
            first = stopped + 1
        return []

    def _read_generally(self, reads: Any, indexes: Any, out: list[bytes],
                        most: int | None = None) -> list[list[bytes]]:
        """Answer reads of a packed run the general way (the first ``most``
        of ``indexes``).  A read that cannot be answered at once (a large
        range, built in steps) and those after it are returned, as
        commands, for the worker."""
        reader = RequestReader(max_bulk=self.server.max_bulk)
        indexes = list(indexes)
        for position, index in enumerate(indexes[:most]):
            for words in reader.feed(reads.source(index)):
                command = self._lookup(words, out)
                if command is not None and command.immediate:
                    try:
                        self._run_now(command, words, out)
                        continue
                    except Unsettled:
                        pass  # it waits for writes to commit: the worker's, as the rest
                if command is not None:
                    return [words, *(later for i in indexes[position + 1:]
                                     for later in reader.feed(reads.source(i)))]
        return []

    def _unpack(self, packed: Any) -> list[list[bytes]]:
        """A packed run's commands (writes or reads), for the general path."""
        reader = RequestReader(max_bulk=self.server.max_bulk)
        sources = packed.sources() if type(packed) is _Packed else map(
            packed.source, range(len(packed)))
        return [words for source in sources for words in reader.feed(source)]

    def _takes(self, packed: Any) -> bool:
        """Whether the fast path takes a packed run: its boards exist and
        take unsigned writes, and the caller may write that much now."""
        if self.principal is None or self.server.monitors or not self.service.takes_packed(
                packed, existing=True):
            return False  # (the general path creates boards, and shows writes to monitors)
        charge = self._charger("submit")
        if charge is not None:
            try:
                charge(len(packed))
            except EngineError:
                return False  # each write is admitted (or refused) alone
        return True

    def _packed_reply(self, tag: int, answer: Any, value: float) -> bytes:
        """The reply of a packed write the engine answered with a Python
        object (tag 0: ZADD, 1: ZINCRBY), as the general path writes it."""
        if isinstance(answer, EngineError):
            self.server.stats[("write", answer.code)] += 1
            return self.replies.error(error_text(answer))
        self.server.stats[("write", "ok")] += 1
        if tag == 0:
            return self.replies.integer(0 if answer["previous"] is not None else 1)
        return self.replies.double(incremented(answer, value))

    def _admit(self, command: Command, words: list[bytes]) -> None:
        """Authentication, scope and rate limits for ``command``: before
        AUTH only the handshake runs; every command is charged, the open
        ones as reads."""
        principal = self.principal
        cost = command.cost(words) if command.cost is not None else 1
        if principal is None:
            if command.name not in HANDSHAKE_COMMANDS:
                raise CommandError(NOAUTH)
            self.gate.limiter.check_address("read", self.address, cost)
            return
        if self.deadline and self.expired:
            self.session_expired()
            raise CommandError(EXPIRED)
        if command.operation is None:
            self.gate.limiter.check("read", self.address, principal.name, cost)
        else:
            self.gate.admit(principal, command.operation, self.address, cost)
        if self.server.monitors and self in self.server.monitors and (
                "write" in command.flags or "readonly" in command.flags):
            raise CommandError(monitor.KEYSPACE_REFUSED)  # as Redis refuses a monitor

    def _failed_auth(self, out: list[bytes]) -> None:
        self.auth_failures += 1
        if self.auth_failures >= MAX_AUTH_FAILURES:
            self.close_with("ERR too many unauthenticated commands; closing", out)

    async def _flush(self, pending: list[tuple[int, Writes | Applied]], out: list[bytes]
                     ) -> None:
        """Submit the pending commands' writes as one batch; fill in their
        replies once they, and the writes applied already, are committed."""
        if not pending:
            return
        taken = list(pending)
        pending.clear()
        failed = await _commits_failed(taken)
        batch = [submission for _, writes in taken if type(writes) is Writes
                 for submission in writes.submissions]
        try:
            answers = await self.service.submit_prepared(batch) if batch else []
        except EngineError as exc:
            answers = [exc] * len(batch)
        position = 0
        for slot, writes in taken:
            if type(writes) is Applied:
                if (error := failed.get(writes.committed)) is not None:
                    out[slot] = self.replies.error(error_text(error)) * writes.replies
                continue
            size = len(writes.submissions)
            try:
                out[slot] = writes.answer(answers[position:position + size])
            except EngineError as exc:
                out[slot] = self.replies.error(error_text(exc))
            position += size

    async def create_and_write(self, name: str, writes: Writes) -> bytes:
        """A write to a key that is no board yet: create it as a Redis-like
        board (which needs the scope that creating boards needs), then write."""
        self.gate.admit(self.principal or ANONYMOUS_ALL, "put_board", self.address)
        await self.service.put_board(name, REDIS_BOARD_DICT)
        self.gate.done(self.principal or ANONYMOUS_ALL, "put_board", self.address, board=name)
        answers = await self.service.submit_prepared(writes.submissions)
        if all(isinstance(a, EngineError) or a.get("skipped") for a in answers):
            with contextlib.suppress(EngineError):  # nothing written: no key, as in Redis
                if len(self.service.view(name)) == 0:
                    await self.service.delete_board(name)
        return writes.answer(answers)

    # --- state -------------------------------------------------------------------------

    def authenticate(self, credential: str) -> None:
        """AUTH and HELLO AUTH: a WRONGPASS ``CommandError`` if refused."""
        try:
            self.principal = self.gate.identify(credential, "auth", self.address)
        except EngineError:
            self.auth_failures += 1
            if self.auth_failures >= MAX_AUTH_FAILURES:
                self.close_with(WRONGPASS)
            raise CommandError(WRONGPASS) from None
        self.expires_with(self.principal)
        self.reader = self._carry_over(self.reader)
        if self.service.topology is not None:  # (its commands relayed go with it)
            cluster_commands.session(self).credential = credential

    def _carry_over(self, old: RequestReader) -> RequestReader:
        """A reader with the limits of the connection's state now (the
        handshake's or the full ones), holding what ``old`` buffered."""
        reader = self._reader()
        reader.take_state(old)
        return reader

    def reset(self) -> None:
        """RESET: the connection as it was when opened."""
        self.replies = Replies(2)
        self.name = None
        self.window = self.period = None
        transactions.forget(self)
        monitor.detach(self)
        if self.gate.auth_enabled:
            self.principal = None
            self.deadline = 0.0
            self.reader = self._carry_over(self.reader)

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    @property
    def busy(self) -> bool:
        # (A monitor is never idle: it listens, as Redis never times one out.)
        return bool(self.queue or self.worker is not None or self.answering
                    or self in self.server.monitors)

    def handshake_expired(self) -> None:
        self.close_with(f"ERR authenticate (AUTH) within {HANDSHAKE_SECONDS:g} s of connecting")

    def idle_expired(self) -> None:
        self.close_with(None)

    def session_expired(self) -> None:
        self.close_with(EXPIRED)

    def close_with(self, text: str | None, out: list[bytes] | None = None) -> None:
        """Write ``out`` and the error ``text``, then close."""
        parts = list(out or [])
        if out is not None:
            out.clear()
        if text is not None:
            parts.append(self.replies.error(text))
        if parts and self.transport is not None:
            self.transport.writelines(parts)
        self.closing = True
        self._forget()
        if self.transport is not None:
            self.transport.close()

    def describe(self) -> str:
        """The CLIENT INFO / CLIENT LIST line."""
        now = self.loop.time()
        flags = "x" if self.multi is not None else "O" if self in self.server.monitors else "N"
        return (f"id={self.id} addr={endpoint(self.transport, 'peername')} "
                f"laddr={endpoint(self.transport, 'sockname')} fd=-1 name={self.name or ''} "
                f"age={int(now - self.opened_at)} idle={int(now - self.last_active)} "
                f"flags={flags} db=0 sub=0 psub=0 ssub=0 "
                f"multi={len(self.multi.queued) if self.multi is not None else -1} "
                f"qbuf=0 qbuf-free=0 argv-mem=0 "
                f"multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd=client "
                f"user=default redir=-1 resp={self.replies.version} "
                f"lib-name={self.library.get('lib-name', '')} "
                f"lib-ver={self.library.get('lib-ver', '')}")


async def _commits_failed(pending: list[tuple[int, Writes | Applied]]
                          ) -> dict[asyncio.Future[None], EngineError]:
    """Wait for the commits of the pending writes applied already (the
    pops of a pass share one); those that failed, with their errors."""
    failed = {}
    for future in {writes.committed: None for _, writes in pending if type(writes) is Applied}:
        try:
            # Shielded: the commit is shared, and a closing connection must not cancel it.
            await asyncio.shield(future)
        except EngineError as exc:
            failed[future] = exc
    return failed


class RespServer(PipelinedServer):
    """Listens for RESP connections; :meth:`close` drains them gracefully."""

    name = "rankd-resp"

    def __init__(self, service: Service, gate: Gate | None = None, *,
                 limits: ConnectionLimits | None = None, idle_timeout: float = 300.0,
                 max_bulk: int = 1 << 20, max_request: int = MAX_REQUEST,
                 port_of: dict[str, Any] | None = None) -> None:
        super().__init__(limits=limits, idle_timeout=idle_timeout)
        self.service = service
        self.gate = gate or Gate.open()
        self.max_bulk = max_bulk
        #: The most bytes of one request buffered (``--max-request-bytes``).
        self.max_request = max_request
        #: What INFO and CONFIG GET report (ports, fsync policy...).
        self.settings: dict[str, Any] = dict(port_of or {})
        self.started_at = 0.0
        self.total_connections = 0
        #: The connections that ran MONITOR, in order (:mod:`.monitor`).
        self.monitors: dict[RespConnection, None] = {}

    async def start(self, host: str, port: int, ssl: ssl_module.SSLContext | None = None
                    ) -> int:
        self.started_at = asyncio.get_running_loop().time()
        bound = await super().start(host, port, ssl)
        self.settings["port"] = bound
        return bound

    def _connection(self) -> RespConnection:
        self.total_connections += 1
        return RespConnection(self)

    async def close(self, grace: float = 10.0) -> None:
        """Close, and at once the connections waiting in a blocking pop, as
        Redis's shutdown does (they would hold the grace period for nothing)."""
        for connection in list(self.connections):
            if connection.unblock is not None:
                connection.close_with(None)
        await super().close(grace)
