# cython: language_level=3, boundscheck=False, wraparound=False
"""The engine's intake of packed runs, natively (see rankd.engine.intake,
whose ``PythonIntake`` is the same in Python and documents it)."""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from rankd.engine._packed cimport Packed

import asyncio
import logging

from rankd.engine.ingest import ingest_packed
from rankd.engine.wal import WalFailedError

log = logging.getLogger("rankd.engine")


cdef int _tell(list thens, error) except -1:
    cdef Py_ssize_t i
    for i in range(0, len(thens), 2):
        try:
            thens[i](thens[i + 1], error)
        except Exception:  # one front-end's bug must not keep the others unanswered
            log.exception("a packed run's completion failed")
    return 0


cdef class Intake:
    """``rankd.engine.intake.PythonIntake``, natively."""

    cdef public object engine
    cdef public set held
    cdef public dict boards
    cdef public bint replicated
    cdef public list runs
    cdef public list thens
    cdef public bint scheduled
    cdef public Py_ssize_t unpacked
    cdef public bint commits_now
    cdef public set expiring
    cdef object run_pass
    cdef object later
    cdef object last_taken
    # The config of the board last taken, and whether it is signed.
    cdef object last_config
    cdef bint last_signed
    cdef object boards_take

    def __init__(self, engine, set held, run_pass, later):
        self.engine = engine
        self.held = held
        self.boards = {}
        self.replicated = False
        self.runs = []
        self.thens = []
        self.scheduled = False
        self.unpacked = 0
        self.commits_now = False
        self.expiring = set()
        self.run_pass = run_pass
        self.later = later
        self.last_taken = None
        # (Imported here: rankd.engine.intake chooses this class at its import.)
        from rankd.engine.intake import boards_take
        self.boards_take = boards_take

    def takes(self, Packed packed, bint existing=False):
        """``PythonIntake.takes``."""
        cdef dict boards = self.boards
        cdef object last = self.last_taken
        cdef PyObject *found
        if last is not None and packed.only_board(last):
            found = PyDict_GetItem(boards, last)
            if found == NULL:
                if existing:
                    return False
                self.last_taken = None
            else:
                config = (<object>found).config
                if config is not self.last_config:  # (a board's config is replaced whole)
                    self.last_config = config
                    self.last_signed = config.signed
                if self.last_signed:
                    return False
                if self.expiring and last in self.expiring:
                    return False
            return self._replicated_takes(packed)
        names = packed.board_names()
        if not self.boards_take(boards, names, existing):
            return False
        if self.expiring and not self.expiring.isdisjoint(names):
            return False
        if len(names) == 1:
            (name,) = names
            self.last_taken = name if name in boards else None
        return self._replicated_takes(packed)

    cdef bint _replicated_takes(self, Packed packed) except -1:
        return not self.replicated or self.engine.takes_replicated(packed)

    def submit_then(self, Packed packed, then, token):
        """``PythonIntake.submit_then``."""
        held = self.held
        if (not self.replicated and self.unpacked == 0
                and (not held or held.isdisjoint(packed.board_names()))):
            self.runs.append(packed)
            self.thens.append(then)
            self.thens.append(token)
            if not self.scheduled:
                self.schedule()
            return
        self.later(packed, then, token)

    def schedule(self):
        """``PythonIntake.schedule``: the pass runs :meth:`commit_pass`."""
        self.scheduled = True
        asyncio.get_running_loop().call_soon(self.commit_pass)

    def commit_pass(self):
        """The pass :meth:`schedule` queued.  Its common case on a single
        node (``commits_now``) is committed here, as ``Engine._run_pass``
        commits it, without the interpreter: packed runs only, none to a
        held board, no other writes waiting on the pass, and records handed
        to the OS at once.  Anything else goes to the engine's pass."""
        engine = self.engine
        if (not self.commits_now or self.replicated or self.held or not self.runs
                or engine._pass_commit is not None or engine._pass_boards):
            self.run_pass()
            return
        runs, thens = self.take_pass()
        try:
            deferred = self._commit(engine, runs, thens)
        except Exception as exc:  # ReadOnly, or a bug (already refusing writes)
            _tell(thens, exc)
            return
        if not deferred:  # (else the pass's task tells them)
            _tell(thens, None)

    cdef int _commit(self, engine, list runs, list thens) except -1:
        """``Engine._apply_runs`` (with ``_count`` and ``_append``), the
        log's ``commit_now`` and ``Engine._committed``, for :meth:`commit_pass`.
        Returns 1 if the waiters are told later: the records start a log
        segment, whose write runs off the loop (``WriteAheadLog._roll_out``)."""
        wal = engine.wal
        if engine.failure is not None or not engine.ready or wal.failed:
            engine._check_writable()  # (raises ReadOnly)
        config = engine.config
        first = wal.last_lsn + 1
        try:
            done = ingest_packed(self.boards, runs, engine.clock(), first,
                                 config.dedupe_ttl, config.ts_tolerance)
        except Exception as exc:
            engine._fail(exc)  # a bug, as in Engine._apply_runs
            raise
        payloads = done.payloads
        cdef Py_ssize_t appended = len(payloads)
        stats = engine.stats
        stats["applied"] += appended
        stats["rejected"] += done.rejected
        stats["duplicate"] += done.duplicates
        try:
            # (With no record appended, what the pass's answers repeat is still written.)
            last = wal.append_many(payloads) if appended else first - 1
            written = wal.commit_now(last)
        except WalFailedError as exc:
            raise engine._read_only_after(exc) from exc
        if last != first - 1 + appended:
            raise AssertionError(f"WAL assigned up to {last}, expected {first - 1 + appended}")
        engine._events_since_snapshot += appended
        if not written:
            engine.finish_soon(False, [], done.boards, thens, None)
            return 1
        engine._committed(done.boards)
        return 0

    cpdef tuple take_pass(self):
        """``PythonIntake.take_pass``."""
        runs, thens = self.runs, self.thens
        self.runs = []
        self.thens = []
        self.scheduled = False
        return runs, thens

    @staticmethod
    def tell(list thens, error):
        """``PythonIntake.tell``."""
        _tell(thens, error)
