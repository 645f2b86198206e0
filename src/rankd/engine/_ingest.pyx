# cython: language_level=3, boundscheck=False, wraparound=False
"""Native ingest: the engine's hot loop, without Python work per submission.

:mod:`rankd.engine.ingest` documents what ingesting a submission does, and
``ingest_python`` there is the reference this must match answer for answer,
record byte for byte and state for state (the tests compare them on random
boards and submissions).

Each submission of the common shape takes the native path: ASCII member,
event id and label, the current time, a number of the kind the board's
policy wants (a score, or an increment on ``sum`` and ``latest`` boards).
It is checked, looked up in the dedupe table, scored under
the board's policy and guards in every window, written to the rank indexes
through their C entry points (one hash lookup and one search per changed
window; the write returns the new rank), encoded as its WAL record by a C
msgpack writer, noted in the dedupe table and labels, and answered.  No
Python object is made but the ones the state or the caller keeps: the
record's bytes and the answer (the dedupe store keeps fingerprints).

Anything else - an error of any kind, a duplicate event id, an explicit
timestamp, non-ASCII text, a number of an unexpected type, a condition
(``ZADD NX|XX|GT|LT``) - is handed,
before it has changed anything, to the reference's ``ingest_one``, which
answers it (or raises its error) exactly as the pure-Python ingest does.
So every message and every rare case is defined once, in Python.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.math cimport fabs, isfinite, signbit
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp

from rankd._pages cimport (
    pg_full, pg_get, pg_prefetch_name, pg_prefetch_slot, pg_put, pg_rank,
)
from rankd._skiplist cimport MAX_EXACT_INT, MAX_MEMBER_BYTES, RankIndex
from rankd.engine._packed cimport (
    NUMBER_FLOAT, NUMBER_INT, NUMBER_NIL, Number, Packed, PackedResult, PackedSubmission,
)
from rankd.engine._idstore cimport FingerprintLog, answer_flags
from rankd.engine._packing cimport (
    Writer, content_fingerprint, put_array, put_bool, put_float, put_int, put_nil, put_str,
    writer_free,
)

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object _PyDict_NewPresized(Py_ssize_t minused)

cdef enum:
    SUBMIT = 3
    RECORD_ITEMS = 11
    RESULT_ITEMS = 4
    MAX_WINDOWS = 4          # rankd.engine.periods.WINDOWS
    MAX_EVENT_ID_BYTES = 128 # rankd.engine.config.MAX_EVENT_ID_BYTES
    MAX_LABEL_CHARS = 64     # rankd.engine.config.MAX_LABEL_CHARS
    POLICY_SUM = 0
    POLICY_BEST = 1
    POLICY_LATEST = 2

cdef struct Window:
    PyObject *name        # str, owned by the plan's `keep` list
    PyObject *period      # str, likewise
    PyObject *index       # native RankIndex, or NULL until the period's first write
    bint primary


cdef struct Plan:
    # A board as this call sees it: what its config means, where its state is.
    PyObject *board
    PyObject *name
    PyObject *labels      # dict
    PyObject *entries     # the dedupe table's store, a FingerprintLog
    int policy
    bint desc
    bint has_min, has_max, has_max_delta
    double min_score, max_score, max_delta
    int nwindows
    Window windows[MAX_WINDOWS]
    Py_ssize_t writes     # version bumps not yet added to the board (_Kernel.flush)
    bint named            # the board is in the call's set of changed boards
    bint paged            # its indexes are rankd._pages's: written through _pages.pxd's pg_*


cdef struct Change:
    bint had
    double old
    double new
    bint updated          # the score changes (or the member is new) in this window


# Built on first use: importing rankd.engine.ingest here would be circular.
cdef object _ingest_one = None
cdef object _Ingested = None
cdef object _EngineError = None
cdef object _period_of = None
cdef object _index_type = None
cdef object _index_class = None   # rankd.index.kinds.current: what new periods are built with
cdef object _paged_type = None    # rankd._pages.RankIndex, if built


cdef _imports():
    global _ingest_one, _Ingested, _EngineError, _period_of, _index_type, _index_class, _paged_type
    from rankd.engine import ingest as reference
    from rankd.engine.errors import EngineError
    from rankd.engine.periods import period_of
    _EngineError = EngineError
    _ingest_one = reference.ingest_one
    _Ingested = reference.Ingested
    _period_of = period_of
    _index_type = RankIndex
    from rankd.index.kinds import current
    _index_class = current
    try:
        from rankd._pages import RankIndex as paged
    except ImportError:
        paged = None
    _paged_type = paged


cdef inline bint _ascii(object text, Py_ssize_t max_size) noexcept:
    """``text`` is a non-empty ASCII ``str`` of at most ``max_size``
    characters, none of them refused (see :func:`_plain`)."""
    return (type(text) is str and PyUnicode_IS_COMPACT_ASCII(text)
            and 0 < PyUnicode_GET_LENGTH(text) <= max_size
            and _plain(_chars(text), PyUnicode_GET_LENGTH(text)))


cdef inline bint _plain(const char *text, Py_ssize_t size) noexcept nogil:
    """UTF-8 ``text`` holds none of the characters names may not hold
    (``rankd.engine.ingest.REFUSED_CHARACTERS``: controls, line separators,
    bidi overrides and isolates, invisible zero-width ones, the BOM).
    Anything it refuses goes the reference way, which says why."""
    cdef const unsigned char *s = <const unsigned char *>text
    cdef Py_ssize_t i
    cdef unsigned char c, b, d
    for i in range(size):
        c = s[i]
        if c < 0x20 or c == 0x7F:
            return False
        if c < 0xC2 or i + 1 >= size:
            continue
        b = s[i + 1]
        if c == 0xC2:
            if b < 0xA0:  # U+0080-U+009F
                return False
        elif i + 2 < size:
            d = s[i + 2]
            if c == 0xE2 and ((b == 0x80 and (d == 0x8B or 0xA8 <= d <= 0xAE))
                              or (b == 0x81 and (0xA0 <= d <= 0xA4 or 0xA6 <= d <= 0xA9))):
                return False  # U+200B, U+2028-202E, U+2060-2064, U+2066-2069
            if c == 0xEF and b == 0xBB and d == 0xBF:  # U+FEFF
                return False
    return True


cdef inline const char *_chars(object text) noexcept:
    return <const char *>PyUnicode_DATA(text)


cdef inline bint _number(object value, double *out) noexcept:
    """A float or exact int, as ``ingest.number`` accepts it; False for
    anything ``number`` would refuse or convert some other way."""
    cdef long long as_int
    cdef int overflow = 0
    if type(value) is float:
        out[0] = PyFloat_AS_DOUBLE(value)
        # -0.0 goes the reference way: which zero is stored is rankd.engine.zeros's to say.
        return isfinite(out[0]) and not (out[0] == 0.0 and signbit(out[0]))
    if type(value) is int:
        as_int = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow or as_int > MAX_EXACT_INT or as_int < -MAX_EXACT_INT:
            return False
        out[0] = <double>as_int
        return True
    return False


cdef int _plan(Plan *plan, object board, object now, list keep) except -1:
    """Fill ``plan`` for ``board`` at time ``now``: 0, or 1 when the board
    cannot take the native path (an index of the pure-Python implementation)."""
    cdef int i = 0
    config = board.config
    keep.append(board)
    plan.board = <PyObject *>board
    name = board.name
    # The records it writes put names' characters as their bytes: only a
    # compact ASCII name is its own UTF-8 (any other goes the reference way).
    if type(name) is not str or not PyUnicode_IS_COMPACT_ASCII(name):
        return 1
    keep.append(name)
    plan.name = <PyObject *>name
    labels = board.labels
    entries = board.dedupe.log
    if type(entries) is not FingerprintLog:
        return 1
    keep.append(labels)
    keep.append(entries)
    plan.labels = <PyObject *>labels
    plan.entries = <PyObject *>entries
    policy = config.policy
    plan.policy = POLICY_SUM if policy == "sum" else POLICY_BEST if policy == "best" else POLICY_LATEST
    plan.desc = config.order == "desc"
    plan.has_min = config.min_score is not None
    plan.has_max = config.max_score is not None
    plan.has_max_delta = config.max_delta is not None
    plan.min_score = config.min_score if plan.has_min else 0.0
    plan.max_score = config.max_score if plan.has_max else 0.0
    plan.max_delta = config.max_delta if plan.has_max_delta else 0.0
    primary = config.primary_window
    windows = config.windows
    if len(windows) > MAX_WINDOWS:
        return 1
    # The skip list is written through its C entry points, the paged index
    # (rankd.index.kinds) through its own (_pages.pxd), chosen here once per
    # board; any other index the reference way.
    expected = _index_class()
    plan.paged = expected is _paged_type and expected is not None
    if expected is not _index_type and not plan.paged:
        return 1
    for window in windows:
        period = _period_of(window, now)
        index = board.index(window, period)
        if index is not None and type(index) is not expected:
            return 1
        if not (type(window) is str and PyUnicode_IS_COMPACT_ASCII(window)
                and type(period) is str and PyUnicode_IS_COMPACT_ASCII(period)):
            return 1
        keep.append(window)
        keep.append(period)
        keep.append(index)
        plan.windows[i].name = <PyObject *>window
        plan.windows[i].period = <PyObject *>period
        plan.windows[i].index = NULL if index is None else <PyObject *>index
        plan.windows[i].primary = window == primary
        i += 1
    plan.nwindows = i
    plan.writes = 0
    plan.named = False
    return 0


cdef inline bint _new_score(Plan *plan, bint had, double old, double value, bint is_delta,
                            double *new) noexcept:
    """``ingest.new_score`` for the cases it accepts; False where it would
    raise (a guard, a non-finite sum), so that the reference reports it."""
    cdef bint better
    if is_delta:
        new[0] = (old if had else 0.0) + value
        if not isfinite(new[0]):
            return False
    elif plan.policy == POLICY_BEST and had:
        better = value > old if plan.desc else value < old
        new[0] = value if better else old
    else:
        new[0] = value
    if had and new[0] == old:
        new[0] = old
        return True
    if plan.has_min and new[0] < plan.min_score:
        return False
    if plan.has_max and new[0] > plan.max_score:
        return False
    if (plan.has_max_delta and had and plan.policy != POLICY_SUM
            and fabs(new[0] - old) > plan.max_delta):
        return False
    return True


cdef inline int _put_text(Writer *w, PyObject *text) except -1:
    # Every str the kernel encodes is compact ASCII (checked: members, event
    # ids and labels per submission, board, window and period names in
    # _plan), so its characters are its UTF-8 bytes.
    return put_str(w, _chars(<object>text), PyUnicode_GET_LENGTH(<object>text))


cdef object _answer(object member, object event_id, object score, object rank, object previous,
                    bint changed):
    cdef dict answer = _PyDict_NewPresized(7)
    answer["member"] = member
    answer["score"] = score
    answer["rank"] = rank
    answer["previous"] = previous
    answer["changed"] = changed
    answer["duplicate"] = False
    answer["event_id"] = event_id
    return answer


cdef struct Input:
    # One submission the native path takes, whichever form it came in.
    const char *member
    Py_ssize_t member_size
    PyObject *member_str    # the member as a str, or NULL: made when a label needs it
    const char *event_id    # ASCII, or NULL
    Py_ssize_t event_id_size
    uint64_t event_fp       # the event id's fingerprint in the board's dedupe store
    PyObject *label         # str or NULL
    double value
    bint is_delta           # value is an increment (sum boards; latest ones' ZINCRBY)


cdef struct KnownFp:
    PyObject *store       # the dedupe store it was computed for (NULL: none)
    uint64_t fp


cdef class _Kernel:
    """One ingest call's state: the plans of the boards it has met, the
    records written so far and the counts."""

    cdef dict boards
    cdef double now
    cdef long long now_ms
    cdef Py_ssize_t first_lsn
    cdef double dedupe_ttl, ts_tolerance
    cdef list payloads
    cdef set names
    cdef Py_ssize_t rejected, duplicates
    cdef Plan plans[8]
    cdef Py_ssize_t nplans
    cdef dict plan_of          # board name -> plan slot, or -1: reference only
    cdef list keep             # owns what the plans point at
    cdef Writer w
    # Event ids' fingerprints, computed when a run is prefetched, for its
    # ingest: two runs' worth (the one ingested, the next), by run parity.
    cdef KnownFp *fps[2]
    cdef Py_ssize_t fps_cap[2]

    def __cinit__(self, dict boards, double now, Py_ssize_t first_lsn, double dedupe_ttl,
                  double ts_tolerance):
        if _Ingested is None:
            _imports()
        self.boards = boards
        self.now = now
        self.now_ms = round(now * 1000)
        self.first_lsn = first_lsn
        self.dedupe_ttl = dedupe_ttl
        self.ts_tolerance = ts_tolerance
        self.payloads = []
        self.names = set()
        self.rejected = self.duplicates = 0
        self.nplans = 0
        self.plan_of = {}
        self.keep = []
        self.w.data = NULL
        self.w.size = self.w.cap = 0
        self.fps[0] = self.fps[1] = NULL
        self.fps_cap[0] = self.fps_cap[1] = 0

    def __dealloc__(self):
        writer_free(&self.w)
        free(self.fps[0])
        free(self.fps[1])

    cdef KnownFp *known_fps(self, int parity, Py_ssize_t count) except NULL:
        """Room for ``count`` fingerprints of the runs of this ``parity``."""
        cdef void *grown
        if count > self.fps_cap[parity] or self.fps[parity] == NULL:
            grown = realloc(self.fps[parity], max(count, 16) * sizeof(KnownFp))
            if grown == NULL:
                raise MemoryError()
            self.fps[parity] = <KnownFp *>grown
            self.fps_cap[parity] = max(count, 16)
        return self.fps[parity]

    cdef object result(self, list answers):
        return _Ingested(answers, self.payloads, self.names, self.rejected, self.duplicates)

    cdef int flush(self) except -1:
        """Add the version bumps of the native writes so far to their
        boards (once per board and call, not per write: two attribute
        writes and two new objects per submission otherwise).  Nothing
        reads a board's version while a call runs but the reference,
        which is flushed for first; each call flushes when it ends,
        failed or not."""
        cdef Py_ssize_t p
        for p in range(self.nplans):
            if self.plans[p].writes:
                board = <object>self.plans[p].board
                board.version += self.plans[p].writes
                board.updated_at = <double>self.now_ms / 1000.0
                self.plans[p].writes = 0
        return 0

    cdef Plan *plan(self, object name) except? NULL:
        """The plan of board ``name`` (a str), NULL if it must take the reference."""
        cdef PyObject *found = PyDict_GetItem(self.plan_of, name)
        cdef Py_ssize_t p
        if found != NULL:
            p = <object>found
        else:
            board = self.boards.get(name)
            p = -1
            if board is not None and self.nplans < 8:
                if _plan(&self.plans[self.nplans], board, self.now, self.keep) == 0:
                    p = self.nplans
                    self.nplans += 1
            if board is not None:
                self.plan_of[name] = p
        return NULL if p < 0 else &self.plans[p]

    cdef Plan *plan_by_bytes(self, const char *name, Py_ssize_t size) except? NULL:
        """:meth:`plan` of a board named by ASCII bytes, allocating nothing
        for a board met before."""
        cdef Py_ssize_t p
        cdef PyObject *known
        for p in range(self.nplans):
            known = self.plans[p].name
            if (PyUnicode_GET_LENGTH(<object>known) == size
                    and memcmp(_chars(<object>known), name, size) == 0):
                return &self.plans[p]
        return self.plan(PyUnicode_DecodeASCII(name, size, NULL))

    cdef bint duplicate_or_live(self, Plan *plan, const char *event_id,
                                Py_ssize_t event_id_size, uint64_t *fp) noexcept:
        """Whether ``event_id`` is remembered and not expired (the reference
        then answers it, as a duplicate or a conflict); its fingerprint into
        ``fp``, for the write."""
        # (casts, not a variable: no reference counting per submission)
        fp[0] = (<FingerprintLog>plan.entries).c_id_fingerprint(event_id, event_id_size)
        return (<FingerprintLog>plan.entries).c_live(fp[0], self.now)

    cdef bint score(self, Plan *plan, Input *sub, Change *changes) noexcept:
        """Every window's change (reads only); False where the reference must
        answer (a guard, a non-finite sum, an index with no room)."""
        cdef int i
        cdef RankIndex index
        for i in range(plan.nwindows):
            if plan.windows[i].index == NULL:
                changes[i].had = False
            elif plan.paged:
                changes[i].had = pg_get(<object>plan.windows[i].index, sub.member,
                                        sub.member_size, &changes[i].old)
            else:
                index = <RankIndex>plan.windows[i].index
                changes[i].had = index.c_get(sub.member, sub.member_size, &changes[i].old)
            if not _new_score(plan, changes[i].had, changes[i].old, sub.value, sub.is_delta,
                              &changes[i].new):
                return False
            changes[i].updated = not changes[i].had or changes[i].new != changes[i].old
            # An index with no room left (ingest.check_room): the reference
            # refuses the whole submission.  (A skip list's room is its
            # 2**32 members: more than memory holds.)
            if (changes[i].updated and plan.paged and plan.windows[i].index != NULL
                    and pg_full(<object>plan.windows[i].index)):
                return False
        return True

    cdef object reference(self, object sub):
        """The reference's answer to ``sub`` (or its EngineError), counted."""
        cdef Py_ssize_t lsn = self.first_lsn + len(self.payloads)
        self.flush()
        try:
            answer = _ingest_one(self.boards, sub, self.now, self.now_ms, lsn, self.dedupe_ttl,
                                 self.ts_tolerance, self.payloads)
        except _EngineError as error:
            self.rejected += 1
            answer = error
        else:
            if answer["duplicate"]:
                self.duplicates += 1
            else:
                self.names.add(sub.board)
        # The reference may have opened periods: plan again.
        self.nplans = 0
        self.plan_of.clear()
        self.keep = []
        return answer

    cdef int apply(self, Plan *plan, Input *sub, Change *changes, PackedResult *out) except -1:
        """Write a scored submission: indexes, WAL record, dedupe table,
        labels, version.  Nothing can fail here but memory."""
        cdef Writer *w = &self.w
        cdef Py_ssize_t lsn = self.first_lsn + len(self.payloads), rank = 0
        cdef uint64_t fingerprint
        cdef uint32_t payload
        cdef int i, nupdates = 0
        cdef RankIndex index
        out.rank = 0
        for i in range(plan.nwindows):  # (periods opened before any window is written)
            if changes[i].updated and plan.windows[i].index == NULL:
                created = (<object>plan.board).index_for_write(
                    <object>plan.windows[i].name, <object>plan.windows[i].period)
                # Written below through the C entry points of the kind
                # planned: an index of any other class would be misread.
                if type(created) is not (_paged_type if plan.paged else _index_type):
                    raise TypeError(
                        f"board {(<object>plan.board).name!r} built a "
                        f"{type(created).__module__}.{type(created).__name__} index, "
                        f"not the kind this process writes natively")
                self.keep.append(created)
                plan.windows[i].index = <PyObject *>created
        for i in range(plan.nwindows):
            if changes[i].updated:
                nupdates += 1
            if changes[i].updated and plan.paged:
                rank = pg_put(<object>plan.windows[i].index, sub.member, sub.member_size,
                              changes[i].new, lsn)
            elif changes[i].updated:
                index = <RankIndex>plan.windows[i].index
                rank = index.c_put(sub.member, sub.member_size, changes[i].new, lsn)
            if plan.windows[i].primary:
                out.has_previous = changes[i].had
                out.previous = changes[i].old
                out.score = changes[i].new
                if changes[i].updated:
                    out.rank = rank
                elif plan.paged:
                    out.rank = pg_rank(<object>plan.windows[i].index, sub.member,
                                       sub.member_size)
                else:
                    out.rank = (<RankIndex>plan.windows[i].index).c_rank(
                        sub.member, sub.member_size)
        out.changed = nupdates > 0

        # The WAL record (rankd.engine.records), as the packer writes it.
        w.size = 0
        put_array(w, RECORD_ITEMS)
        put_int(w, SUBMIT)
        _put_text(w, plan.name)
        put_str(w, sub.member, sub.member_size)
        put_float(w, sub.value)
        put_bool(w, sub.is_delta)
        if sub.event_id == NULL:
            put_nil(w)
        else:
            put_str(w, sub.event_id, sub.event_id_size)
        put_int(w, self.now_ms)
        put_int(w, self.now_ms)
        if sub.label == NULL:
            put_nil(w)
        else:
            _put_text(w, sub.label)
        put_array(w, nupdates)
        for i in range(plan.nwindows):
            if changes[i].updated:
                put_array(w, 3)
                _put_text(w, plan.windows[i].name)
                _put_text(w, plan.windows[i].period)
                put_float(w, changes[i].new)
        put_array(w, RESULT_ITEMS)
        put_float(w, out.score)
        put_int(w, out.rank)
        if out.has_previous:
            put_float(w, out.previous)
        else:
            put_nil(w)
        put_bool(w, out.changed)
        PyList_Append(self.payloads, PyBytes_FromStringAndSize(w.data, w.size))

        # What the record changes besides the indexes (ingest.note_submit).
        if sub.label != NULL:
            if sub.member_str == NULL:
                member = PyUnicode_DecodeASCII(sub.member, sub.member_size, NULL)
            else:
                member = <object>sub.member_str
            PyDict_SetItem(<object>plan.labels, member, <object>sub.label)
        if sub.event_id != NULL:
            # Labels here are compact ASCII (see _put_text): their characters are their bytes.
            fingerprint = content_fingerprint(
                sub.is_delta, sub.value,
                NULL if sub.label == NULL else _chars(<object>sub.label),
                0 if sub.label == NULL else PyUnicode_GET_LENGTH(<object>sub.label))
            payload = (<FingerprintLog>plan.entries).c_payload(
                sub.member, sub.member_size, fingerprint, True)
            (<FingerprintLog>plan.entries).c_put(sub.event_fp, payload, <double>self.now_ms / 1000.0 + self.dedupe_ttl,
                        answer_flags(True, out.has_previous, True, out.changed),
                        out.score, out.previous, out.rank)
        if nupdates:
            plan.writes += 1
        if not plan.named:
            self.names.add(<object>plan.name)
            plan.named = True
        return 0


def ingest(dict boards, submissions, double now, Py_ssize_t first_lsn, double dedupe_ttl,
           double ts_tolerance):
    """Native ``rankd.engine.ingest.ingest_python``: same arguments, same result."""
    cdef _Kernel kernel = _Kernel(boards, now, first_lsn, dedupe_ttl, ts_tolerance)
    cdef list answers = []
    cdef Plan *plan
    cdef Input sub
    cdef Change changes[MAX_WINDOWS]
    cdef PackedResult out
    cdef bint native
    try:
        for submission in submissions:
            name = submission.board
            plan = kernel.plan(name) if type(name) is str else NULL
            member = submission.member
            label = submission.label
            event_id = submission.event_id
            native = (plan != NULL and _ascii(member, MAX_MEMBER_BYTES)
                      and (label is None
                           or (type(label) is str and PyUnicode_IS_COMPACT_ASCII(label)
                               and PyUnicode_GET_LENGTH(label) <= MAX_LABEL_CHARS
                               and _plain(_chars(label), PyUnicode_GET_LENGTH(label))))
                      and (event_id is None or _ascii(event_id, MAX_EVENT_ID_BYTES))
                      and submission.ts is None and submission.condition == 0)
            if native and event_id is not None:
                native = not kernel.duplicate_or_live(plan, _chars(event_id),
                                                      PyUnicode_GET_LENGTH(event_id),
                                                      &sub.event_fp)
            if native:
                sub.is_delta = plan.policy == POLICY_SUM or (
                    plan.policy == POLICY_LATEST and submission.delta is not None)
                if sub.is_delta:
                    native = (submission.score is None and _number(submission.delta, &sub.value)
                              and not (plan.has_max_delta and fabs(sub.value) > plan.max_delta))
                else:
                    native = submission.delta is None and _number(submission.score, &sub.value)
            if native:
                sub.member = _chars(member)
                sub.member_size = PyUnicode_GET_LENGTH(member)
                sub.member_str = <PyObject *>member
                if event_id is None:
                    sub.event_id = NULL
                else:
                    sub.event_id = _chars(event_id)
                    sub.event_id_size = PyUnicode_GET_LENGTH(event_id)
                sub.label = NULL if label is None else <PyObject *>label
                native = kernel.score(plan, &sub, changes)
            if not native:
                answers.append(kernel.reference(submission))
                continue
            kernel.apply(plan, &sub, changes, &out)
            answers.append(_answer(member, event_id, out.score, out.rank,
                                   out.previous if out.has_previous else None, out.changed))
    finally:
        kernel.flush()  # also when a write fails: what was applied counts
    return kernel.result(answers)


cdef inline bint _packed_number(Number *number, double *out) noexcept:
    """``_number`` for a number read off the wire."""
    if number.kind == NUMBER_FLOAT:
        out[0] = number.fval
        return isfinite(out[0]) and not (out[0] == 0.0 and signbit(out[0]))  # see _number
    if number.kind == NUMBER_INT:
        if number.ival > MAX_EXACT_INT or number.ival < -MAX_EXACT_INT:
            return False
        out[0] = <double>number.ival
        return True
    return False


def ingest_packed(dict boards, list runs, double now, Py_ssize_t first_lsn,
                  double dedupe_ttl, double ts_tolerance):
    """:func:`ingest` of packed submissions: ``runs`` of them (``Packed``),
    applied in order as one batch.  The answers go to each run
    (``results``, or ``answers`` for those the reference answered); the
    result's ``answers`` is None."""
    cdef _Kernel kernel = _Kernel(boards, now, first_lsn, dedupe_ttl, ts_tolerance)
    cdef Packed packed
    cdef Py_ssize_t k, n = len(runs)
    # Each run's lookups are warmed in two steps a run apart (slots while
    # the run before is applied, then the nodes they point to), so a
    # submission rarely waits for memory to find its member or event id.
    try:
        if n:
            _prefetch(kernel, <Packed>runs[0], False, 0)
        for k in range(n):
            packed = <Packed>runs[k]
            if k + 1 < n:
                _prefetch(kernel, <Packed>runs[k + 1], False, (k + 1) & 1)
            _prefetch(kernel, packed, True, k & 1)
            _ingest_run(kernel, packed, kernel.fps[k & 1])
    finally:
        kernel.flush()
    return kernel.result(None)


cdef void _prefetch(_Kernel kernel, Packed packed, bint nodes, int parity) except *:
    """Start loading what a run's lookups read first: each event id's slot
    in its dedupe table (its fingerprint kept for the ingest, in the
    kernel's ``fps`` of ``parity``) and each member's in its indexes' hash
    tables; or, with ``nodes`` (once the slots had time to load), the node
    each member's slot points to."""
    cdef PackedSubmission *item
    cdef Plan *plan
    cdef Py_ssize_t i
    cdef int w
    cdef KnownFp *known = NULL
    if not nodes:
        known = kernel.known_fps(parity, packed.count)
    for i in range(packed.count):
        item = &packed.items[i]
        if known != NULL:
            known[i].store = NULL
        plan = kernel.plan_by_bytes(packed.chars(&item.board), item.board.size)
        if plan == NULL or not 0 < item.member.size <= MAX_MEMBER_BYTES:
            continue
        if (not nodes and item.event_id.present
                and 0 < item.event_id.size <= MAX_EVENT_ID_BYTES):
            known[i].store = plan.entries
            known[i].fp = (<FingerprintLog>plan.entries).c_id_fingerprint(
                packed.chars(&item.event_id), item.event_id.size)
            (<FingerprintLog>plan.entries).c_prefetch(known[i].fp)
        for w in range(plan.nwindows):
            if plan.windows[w].index == NULL:
                continue
            if plan.paged:
                if nodes:
                    pg_prefetch_name(<object>plan.windows[w].index,
                                     packed.chars(&item.member), item.member.size)
                else:
                    pg_prefetch_slot(<object>plan.windows[w].index,
                                     packed.chars(&item.member), item.member.size)
            elif nodes:  # (casts, not a variable: no reference counting per member)
                (<RankIndex>plan.windows[w].index).c_prefetch_node(
                    packed.chars(&item.member), item.member.size)
            else:
                (<RankIndex>plan.windows[w].index).c_prefetch_slot(
                    packed.chars(&item.member), item.member.size)


cdef int _ingest_run(_Kernel kernel, Packed packed, const KnownFp *known) except -1:
    cdef list answers = [None] * packed.count
    cdef PackedSubmission *item
    cdef Plan *plan
    cdef Input sub
    cdef Change changes[MAX_WINDOWS]
    cdef Py_ssize_t i
    cdef bint native
    for i in range(packed.count):
        item = &packed.items[i]
        plan = kernel.plan_by_bytes(packed.chars(&item.board), item.board.size)
        native = (plan != NULL and 0 < item.member.size <= MAX_MEMBER_BYTES
                  and _plain(packed.chars(&item.member), item.member.size)
                  and (not item.label.present
                       or (item.label.size <= MAX_LABEL_CHARS
                           and _plain(packed.chars(&item.label), item.label.size)))
                  and (not item.event_id.present
                       or (0 < item.event_id.size <= MAX_EVENT_ID_BYTES
                           and _plain(packed.chars(&item.event_id), item.event_id.size))))
        if native and item.event_id.present:
            if known[i].store == plan.entries:  # (fingerprinted when prefetched)
                sub.event_fp = known[i].fp
                native = not (<FingerprintLog>plan.entries).c_live(sub.event_fp, kernel.now)
            else:
                native = not kernel.duplicate_or_live(plan, packed.chars(&item.event_id),
                                                      item.event_id.size, &sub.event_fp)
        if native:
            sub.is_delta = plan.policy == POLICY_SUM or (
                plan.policy == POLICY_LATEST and item.delta.kind > NUMBER_NIL)
            if sub.is_delta:
                native = (item.score.kind <= NUMBER_NIL
                          and _packed_number(&item.delta, &sub.value)
                          and not (plan.has_max_delta and fabs(sub.value) > plan.max_delta))
            else:
                native = (item.delta.kind <= NUMBER_NIL
                          and _packed_number(&item.score, &sub.value))
        label = None
        if native:
            sub.member = packed.chars(&item.member)
            sub.member_size = item.member.size
            sub.member_str = NULL
            if item.event_id.present:
                sub.event_id = packed.chars(&item.event_id)
                sub.event_id_size = item.event_id.size
            else:
                sub.event_id = NULL
            label = packed.text(&item.label)
            sub.label = NULL if label is None else <PyObject *>label
            native = kernel.score(plan, &sub, changes)
        if not native:
            answers[i] = kernel.reference(packed.submission(i))
            continue
        kernel.apply(plan, &sub, changes, &packed.results[i])
    packed.answers = answers
    return 0
