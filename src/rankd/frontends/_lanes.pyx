# cython: language_level=3, boundscheck=False, wraparound=False
"""The hot paths of the TCP and RESP connections, natively.

:class:`TcpLane` and :class:`RespLane` are the first bases of
``TcpConnection`` and ``RespConnection`` when the native modules are built.
A read that is one run of plain writes (TCP submits; RESP ``ZADD``/
``ZINCRBY``) or, on RESP, one run of plain reads is what a client that does
not pipeline deeply sends on every request: the lane scans it, checks that
the fast path may take it (the boards, the caller's admission) and hands it
to the engine, or answers the reads, without running Python bytecode for
it, and writes the replies of a committed run the same way.  Everything
else goes to the connection's ``_data_received``, the general path, which
answers all of it alike: a lane only saves the interpreter's time.  The
state a lane reads lives in its C fields; Python code reads and sets it as
attributes, as before.
"""

from rankd.engine._packed cimport Packed, PackedReads
from rankd.engine._reads cimport Reads
from rankd.frontends._submits cimport encode_run, split_run
from rankd.frontends.resp._scanner cimport replies_of, scan_run

from rankd.engine.errors import EngineError
from rankd.frontends.connections import _PENDING, PipelinedConnection
from rankd.frontends.resp.protocol import OUT_HIGH_WATER
from rankd.frontends.resp.sorted_sets import MAX_REPLY_ENTRIES
from rankd import wire

cdef object PENDING = _PENDING
cdef object WRITE_OK = ("write", "ok")
cdef object READ_OK = ("read", "ok")
cdef object SUBMIT_OK = ("submit", "ok")
cdef object WIRE_OK = wire.ok
cdef object WIRE_ERROR = wire.error


cdef class LaneCounts:
    """What a server's native lanes answered, in C counters (a dict update
    per request cost about 800 instructions); the server adds them to its
    ``Tally`` when asked (``PipelinedServer.counts``)."""

    cdef public Py_ssize_t write_ok, read_ok, submit_ok
    # The loop's ``pacing.LoopPacer``, when there is one: a lane's request
    # calls ``wake`` while ``armed`` is set (the first of each pass).
    cdef public bint armed
    cdef public object wake

    def items(self):
        """``(key, count)`` of each count, keyed as in the server's ``Tally``."""
        return [(WRITE_OK, self.write_ok), (READ_OK, self.read_ok),
                (SUBMIT_OK, self.submit_ok)]

    def clear(self):
        self.write_ok = self.read_ok = self.submit_ok = 0


cdef class Lane:
    """What both lanes share: admission worked out once per caller, the
    hand-over of a run to the engine, and the completion of the one run in
    flight (``PipelinedConnection``'s, for the common case)."""

    # The connection's state (set by ``PipelinedConnection`` and its subclass).
    cdef public object server
    cdef public object service
    cdef public object transport
    cdef public object principal
    cdef public object queue
    cdef public object answering
    cdef public object worker
    cdef public object _all_answered
    cdef public bint closing
    # The connection's answers may go in any order (TCP's ``out_of_order``:
    # ``rankd.frontends.tcp_any_order``): a run committed while others are
    # in flight is answered at once.
    cdef public bint any_order
    # The transport is lost: replies are dropped (``peer_end``).
    cdef public bint gone
    cdef public bint writable
    cdef public double last_active
    # When the caller's credential expires, in loop time (0: never): past
    # it the fast path takes nothing and the general path closes.
    cdef public double deadline
    # Worked out once per caller: ``_charger("submit")`` and ``("top")``
    # for ``charged_for``.
    cdef object charged_for
    cdef object charge
    cdef object charge_reads
    # Bound once the connection is made (``_bind``).
    cdef LaneCounts counts  # the server's
    cdef object write
    cdef object time
    cdef object takes
    cdef object submit_then
    cdef object applied_then
    cdef object answering_append  # (bound once: a method lookup per request otherwise)
    cdef object answering_clear
    # The connection's decoder (TCP) or reader (RESP) is known to hold
    # nothing, checked once after each read the general path fed it: the
    # common read skips looking.
    cdef bint settled

    cdef int _bind(self) except -1:
        self.time = self.loop.time
        server = self.server
        if server.lane_counts is None:
            server.lane_counts = LaneCounts()
            if server.pacer is not None:
                server.pacer.attach(server.lane_counts)
        self.counts = server.lane_counts
        self.write = self.transport.write
        self.takes = self.service.takes_packed
        self.submit_then = self.service.submit_packed_then
        self.applied_then = self._applied
        self.answering_append = self.answering.append
        self.answering_clear = self.answering.clear
        return 0

    cdef bint _admitted(self, object run, bint reads) except -1:
        """The caller may submit (or read) a run that large now, as
        ``_charger`` works it out, once per caller."""
        principal = self.principal
        if self.deadline != 0 and self.time() > self.deadline:
            return False  # the general path closes the session
        if principal is not self.charged_for:
            self.charge = self._charger("submit")
            self.charge_reads = self._charger("top")
            self.charged_for = principal
        charge = self.charge_reads if reads else self.charge
        if charge is not None:
            try:
                charge(len(run))
            except EngineError:
                return False
        return True

    cdef bytes _encode(self, Packed packed):
        raise NotImplementedError

    cdef int _generally(self, data) except -1:
        """The general path (the connection's ``_data_received``), which alone
        feeds the decoder or reader: it may hold part of a request afterwards."""
        self.settled = False
        self._data_received(data)
        return 0

    def _hand_over(self, packed):
        """Hand a run to the engine: its replies follow once it is committed."""
        if self.time is None:
            self._bind()
        self._hand_over_run(packed)

    cdef int _hand_over_run(self, Packed packed) except -1:
        entry = [packed, PENDING]
        self.answering_append(entry)
        self.submit_then(packed, self.applied_then, entry)
        return 0

    def _applied(self, entry, error):
        """``PipelinedConnection._applied``, the one run in flight committed
        (the common case) answered here."""
        answering = self.answering
        if error is None and len(answering) == 1 and answering[0] is entry:
            self.answering_clear()
            if not (self.closing or self.gone):
                self.write(self._encode(entry[0]))
            if self._all_answered is not None:
                self._tell_answered()
            return
        if self.any_order:
            self._applied_any_order(entry, error)
            return
        PipelinedConnection._applied(self, entry, error)

    def _encoded(self, packed):
        """The replies of an applied packed run (and its statistics)."""
        if self.time is None:
            self._bind()
        return self._encode(packed)


cdef class TcpLane(Lane):
    """The native part of ``TcpConnection`` (see the module docstring)."""

    cdef object current_decoder
    cdef public bint greeted
    cdef public Py_ssize_t queued
    # Runs with the engine at which a read goes the general way (its worker
    # hands over more once they are answered): ``tcp.MAX_RUNS_IN_FLIGHT``.
    cdef public Py_ssize_t max_runs
    # The decoder's frame limit, read when ``settled`` is set.
    cdef Py_ssize_t max_frame

    @property
    def decoder(self):
        """The connection's ``RequestDecoder``."""
        return self.current_decoder

    @decoder.setter
    def decoder(self, decoder):
        self.current_decoder = decoder
        self.settled = False  # (checked at the next read)

    def data_received(self, data):
        cdef Packed packed
        if (self.closing or not self.greeted or self.principal is None
                or self.worker is not None or self.queue or not self.writable
                or len(self.answering) >= self.max_runs):
            self._generally(data)
            return
        if not self.settled:
            decoder = self.current_decoder
            if not decoder.pack or decoder._buffer:
                self._generally(data)
                return
            self.max_frame = decoder.max_frame
            self.settled = True
        if self.time is None:
            self._bind()
        self.last_active = self.time()
        packed = split_run(data, self.max_frame)
        if packed is None:
            self._generally(data)  # (the split changed nothing: it is done again)
            return
        if self.takes(packed) and self._admitted(packed, False):
            self._hand_over_run(packed)
        else:  # each submit admitted (or refused) alone, by the worker
            self._enqueue(packed)
            self._settle()
        if self.counts.armed:  # after the hand-over: the pass's commit goes first
            self.counts.wake()

    cdef bytes _encode(self, Packed packed):
        cdef Py_ssize_t answered
        frames = encode_run(packed, WIRE_OK, WIRE_ERROR, &answered)
        if answered == packed.count:
            self.counts.submit_ok += answered
        else:  # some answers are Python objects (or errors)
            self._count(packed, answered)
        return frames


cdef class RespLane(Lane):
    """The native part of ``RespConnection`` (see the module docstring)."""

    cdef public object window
    cdef public object period
    cdef public bint packs
    # On a cluster node runs of reads go through ``_reads``, which routes by slot.
    cdef public bint routed
    cdef object current_reader
    cdef object current_replies
    # Of ``reader`` and ``replies``, read when they are set.
    cdef Py_ssize_t max_bulk, max_words
    cdef int version
    cdef Reads reads
    cdef object packed_reply

    @property
    def reader(self):
        """The connection's ``RequestReader``."""
        return self.current_reader

    @reader.setter
    def reader(self, reader):
        self.current_reader = reader
        self.settled = False  # (checked at the next read)
        self.max_bulk, self.max_words = reader.max_bulk, reader.max_multibulk

    @property
    def replies(self):
        """The connection's ``Replies`` (its RESP version's)."""
        return self.current_replies

    @replies.setter
    def replies(self, replies):
        self.current_replies = replies
        self.version = replies.version

    cdef int _bind(self) except -1:
        Lane._bind(self)
        self.reads = self.service.plain_reads
        self.packed_reply = self._packed_reply
        return 0

    def data_received(self, data):
        if (self.closing or not self.packs or self.principal is None
                or self.worker is not None or self.queue or self.answering
                or not self.writable):
            self._generally(data)
            return
        if not self.settled:
            reader = self.current_reader
            if reader._buffer or reader._words is not None:
                self._generally(data)
                return
            self.settled = True
        if self.time is None:
            self._bind()
        self.last_active = self.time()
        item = scan_run(data, self.max_bulk, self.max_words)
        if item is None:
            self._generally(data)  # (the scan changed nothing: it is done again)
            return
        if type(item) is Packed:
            # The boards exist (else the general path creates them) and take
            # unsigned writes, and the caller may write that much now.
            if self.takes(item, True) and self._admitted(item, False):
                self._hand_over_run(item)
            else:  # each write admitted (or refused) alone, by the worker
                self._queue_items(self._unpack(item))
        elif type(item) is PackedReads:
            self._answer(item)
        else:  # pops: the worker's (``pop_lane``), which awaits their commit
            self._queue_items([item])
        if self.counts.armed:  # after the hand-over: the pass's commit goes first
            self.counts.wake()

    cdef int _answer(self, PackedReads reads) except -1:
        """``RespConnection._reads`` of a run read alone: when every read is
        answered natively at once (the common case), written here."""
        cdef Py_ssize_t stopped
        if self.routed:
            out = []
            rest = self._reads(reads, out)
        elif self.window is None and self.period is None and self._admitted(reads, True):
            data = self.reads.c_answer(reads, 0, self.version, MAX_REPLY_ENTRIES,
                                       OUT_HIGH_WATER, &stopped)
            if stopped >= len(reads):
                self.counts.read_ok += stopped
                if data:
                    self.write(data)
                return 0
            out = []
            rest = self._answer_reads(reads, out)  # again the general way (reads change nothing)
        else:
            out = []
            rest = self._read_generally(reads, range(len(reads)), out)
        if out:
            self.transport.writelines(out)
        if rest:
            self._queue_items(rest)  # (what is left waits for the client)
        return 0

    cdef bytes _encode(self, Packed packed):
        cdef Py_ssize_t answered
        data = replies_of(packed, self.version, self.packed_reply, &answered)
        self.counts.write_ok += answered
        return data
