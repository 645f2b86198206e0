# cython: language_level=3, boundscheck=False, wraparound=False
"""The hot path of a RESP connection, natively.

:class:`RespLane` is the first base of ``RespConnection`` when the native
modules are built.  A read that is one whole plain write (``ZADD``/
``ZINCRBY``, see ``_scanner``) or one run of plain reads, arriving while the
connection has nothing queued or in flight, is what an unpipelined client
sends on every request; the lane scans it, checks that the fast path may
take it and hands it to the engine (or answers the reads) without running
Python bytecode for it, and writes a committed run's replies the same way.
Everything else goes to ``RespConnection._data_received``, the general
path, which answers all of it alike (the lane only saves the
interpreter's time).  The connection's state the lane reads lives in its
C fields; Python code reads and sets it as attributes, as before.
"""

from rankd.engine._packed cimport Packed, PackedReads

from rankd.engine.errors import EngineError
from rankd.frontends.connections import _PENDING, PipelinedConnection
from rankd.frontends.resp._scanner import encode_replies, scan

cdef object PENDING = _PENDING
cdef object WRITE_OK = ("write", "ok")


cdef class RespLane:
    """The native part of ``RespConnection`` (see the module docstring)."""

    # The state ``data_received`` reads on every call (set by the connection).
    cdef public object server
    cdef public object service
    cdef public object transport
    cdef public object reader
    cdef public object principal
    cdef public object replies
    cdef public object queue
    cdef public object answering
    cdef public object worker
    cdef public object _all_answered
    cdef public bint closing
    cdef public bint writable
    cdef public bint packs
    cdef public double last_active
    # Worked out once per caller: ``_charger("submit")`` for ``charged_for``.
    cdef object charged_for
    cdef object charge
    # Bound once.
    cdef object time
    cdef object takes
    cdef object submit_then
    cdef object applied_then
    cdef object packed_reply

    def data_received(self, data):
        if (self.closing or not self.packs or self.principal is None
                or self.worker is not None or self.queue or self.answering
                or not self.writable):
            self._data_received(data)
            return
        reader = self.reader
        if reader._buffer or reader._words is not None:
            self._data_received(data)
            return
        if self.time is None:
            self.time = self.loop.time
        self.last_active = self.time()
        items, end, error = scan(data, 0, reader.max_bulk, reader.max_multibulk, True)
        if end != len(data) or error is not None or len(items) != 1:
            self._data_received(data)  # (the scan changed nothing: it is done again)
            return
        item = items[0]
        if type(item) is Packed:
            if self._take(item):
                self._hand_over(item)
            else:  # each write admitted (or refused) alone, by the worker
                self._queue_items(self._unpack(item))
        elif type(item) is PackedReads:
            out = []
            rest = self._reads(item, out)  # (what is left waits for the client)
            if out:
                self.transport.writelines(out)
            if rest:
                self._queue_items(rest)
        else:
            self._data_received(data)

    cdef bint _take(self, Packed packed) except -1:
        """``RespConnection._takes``: the run's boards exist and take
        unsigned writes, and the caller may write that much now."""
        if self.takes is None:
            self.takes = self.service.takes_packed
        if not self.takes(packed, True):
            return False  # (the general path creates boards)
        principal = self.principal
        if principal is not self.charged_for:
            self.charge = self._charger("submit")
            self.charged_for = principal
        if self.charge is not None:
            try:
                self.charge(len(packed))
            except EngineError:
                return False
        return True

    def _hand_over(self, packed):
        """Hand a run to the engine: its replies follow once it is committed."""
        entry = [packed, PENDING]
        self.answering.append(entry)
        if self.submit_then is None:
            self.submit_then = self.service.submit_packed_then
            self.applied_then = self._applied
        self.submit_then(packed, self.applied_then, entry)

    def _applied(self, entry, error):
        """``PipelinedConnection._applied``, the one run in flight committed
        (the common case) answered here."""
        answering = self.answering
        if error is None and len(answering) == 1 and answering[0] is entry:
            answering.clear()
            if not self.closing:
                self.transport.write(self._encode(entry[0]))
            if self._all_answered is not None:
                self._tell_answered()
            return
        PipelinedConnection._applied(self, entry, error)

    def _encoded(self, packed):
        """The replies of an applied packed run (and its statistics)."""
        return self._encode(packed)

    cdef bytes _encode(self, Packed packed):
        if self.packed_reply is None:
            self.packed_reply = self._packed_reply
        data, answered = encode_replies(packed, self.replies.version, self.packed_reply)
        self.server.stats[WRITE_OK] += answered
        return data
