# cython: language_level=3, boundscheck=False, wraparound=False
"""Native ingest: the engine's hot loop, without Python work per submission.

:mod:`rankd.engine.ingest` documents what ingesting a submission does, and
``ingest_python`` there is the reference this must match answer for answer,
record byte for byte and state for state (the tests compare them on random
boards and submissions).

Each submission of the common shape takes the native path: ASCII member,
event id and label, the current time, a number of the kind the board's
policy wants.  It is checked, looked up in the dedupe table, scored under
the board's policy and guards in every window, written to the rank indexes
through their C entry points (one hash lookup and one search per changed
window; the write returns the new rank), encoded as its WAL record by a C
msgpack writer, noted in the dedupe table and labels, and answered.  No
Python object is made but the ones the state or the caller keeps: the
record's bytes, the dedupe entry and the answer.

Anything else - an error of any kind, a duplicate event id, an explicit
timestamp, non-ASCII text, a number of an unexpected type - is handed,
before it has changed anything, to the reference's ``ingest_one``, which
answers it (or raises its error) exactly as the pure-Python ingest does.
So every message and every rare case is defined once, in Python.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_DelItem, PyDict_GetItem, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport PyObject
from libc.math cimport fabs, isfinite
from libc.stdint cimport int64_t
from libc.string cimport memcpy

from rankd._skiplist cimport RankIndex
from rankd.engine._packing cimport (
    Writer, dedupe_entry, put_array, put_bool, put_float, put_int, put_nil, put_str,
    writer_free,
)

cdef extern from "Python.h":
    PyObject *PyDict_SetDefault(object mapping, object key, object default) except NULL
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object _PyDict_NewPresized(Py_ssize_t minused)

cdef enum:
    SUBMIT = 3
    RECORD_ITEMS = 11
    RESULT_ITEMS = 4
    MAX_WINDOWS = 4          # rankd.engine.periods.WINDOWS
    MAX_MEMBER_BYTES = 256   # rankd.index.MAX_MEMBER_BYTES
    MAX_EVENT_ID_BYTES = 128 # rankd.engine.config.MAX_EVENT_ID_BYTES
    MAX_LABEL_CHARS = 64     # rankd.engine.config.MAX_LABEL_CHARS
    POLICY_SUM = 0
    POLICY_BEST = 1
    POLICY_LATEST = 2

#: Integers beyond this do not survive the trip through a float64 score.
cdef long long MAX_EXACT_INT = 2 ** 53


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
    PyObject *entries     # the dedupe table's dict
    int policy
    bint desc
    bint has_min, has_max, has_max_delta
    double min_score, max_score, max_delta
    int nwindows
    Window windows[MAX_WINDOWS]


cdef struct Change:
    bint had
    double old
    double new


# Built on first use: importing rankd.engine.ingest here would be circular.
cdef object _ingest_one = None
cdef object _Ingested = None
cdef object _EngineError = None
cdef object _period_of = None
cdef object _index_type = None


cdef _imports():
    global _ingest_one, _Ingested, _EngineError, _period_of, _index_type
    from rankd.engine import ingest as reference
    from rankd.engine.errors import EngineError
    _EngineError = EngineError
    from rankd.engine.periods import period_of
    _ingest_one = reference.ingest_one
    _Ingested = reference.Ingested
    _period_of = period_of
    _index_type = RankIndex


cdef inline bint _ascii(object text, Py_ssize_t max_size) noexcept:
    """``text`` is a non-empty ASCII ``str`` of at most ``max_size`` characters."""
    return (type(text) is str and PyUnicode_IS_COMPACT_ASCII(text)
            and 0 < PyUnicode_GET_LENGTH(text) <= max_size)


cdef inline const char *_chars(object text) noexcept:
    return <const char *>PyUnicode_DATA(text)


cdef inline bint _number(object value, double *out) noexcept:
    """A float or exact int, as ``ingest.number`` accepts it; False for
    anything ``number`` would refuse or convert some other way."""
    cdef long long as_int
    cdef int overflow = 0
    if type(value) is float:
        out[0] = PyFloat_AS_DOUBLE(value)
        return isfinite(out[0])
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
    keep.append(name)
    plan.name = <PyObject *>name
    labels = board.labels
    entries = board.dedupe.raw()
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
    for window in windows:
        period = _period_of(window, now)
        index = board.index(window, period)
        if index is not None and type(index) is not _index_type:
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
    return 0


cdef inline bint _new_score(Plan *plan, bint had, double old, double value, double *new
                            ) noexcept:
    """``ingest.new_score`` for the cases it accepts; False where it would
    raise (a guard, a non-finite sum), so that the reference reports it."""
    cdef bint better
    if plan.policy == POLICY_SUM:
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
    # Every str the kernel encodes is compact ASCII (checked, or a window or
    # period name), so its characters are its UTF-8 bytes.
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


def ingest(dict boards, submissions, double now, Py_ssize_t first_lsn, double dedupe_ttl,
           double ts_tolerance):
    """Native ``rankd.engine.ingest.ingest_python``: same arguments, same result."""
    if _Ingested is None:
        _imports()
    cdef list answers = []
    cdef list payloads = []
    cdef set names = set()
    cdef Py_ssize_t rejected = 0, duplicates = 0, lsn, rank, i, size
    cdef long long now_ms = round(now * 1000)
    cdef Plan plans[8]
    cdef Py_ssize_t nplans = 0, p
    cdef dict plan_of = {}          # board name -> plan slot, or -1: reference only
    cdef list keep = []             # owns what the plans point at
    cdef Plan *plan
    cdef Change changes[MAX_WINDOWS]
    cdef Writer w
    cdef PyObject *found
    cdef double value, expires_at
    cdef bint native, updated
    cdef RankIndex index
    cdef const char *member_data
    cdef Py_ssize_t member_size
    cdef int nupdates
    cdef int64_t primary_rank
    cdef double primary_new = 0.0, primary_old = 0.0
    cdef bint primary_had = False
    w.data = NULL
    w.size = w.cap = 0
    try:
        for sub in submissions:
            lsn = first_lsn + len(payloads)
            name = sub.board
            native = False
            plan = NULL
            if type(name) is str:
                found = PyDict_GetItem(plan_of, name)
                if found != NULL:
                    p = <object>found
                else:
                    board = boards.get(name)
                    p = -1
                    if board is not None and nplans < 8:
                        if _plan(&plans[nplans], board, now, keep) == 0:
                            p = nplans
                            nplans += 1
                    if board is not None:
                        plan_of[name] = p
                if p >= 0:
                    plan = &plans[p]
            member = sub.member
            label = sub.label
            event_id = sub.event_id
            if (plan != NULL and _ascii(member, MAX_MEMBER_BYTES)
                    and (label is None or (type(label) is str and PyUnicode_IS_COMPACT_ASCII(label)
                                           and PyUnicode_GET_LENGTH(label) <= MAX_LABEL_CHARS))
                    and (event_id is None or _ascii(event_id, MAX_EVENT_ID_BYTES))
                    and sub.ts is None):
                native = True
                if event_id is not None:
                    found = PyDict_GetItem(<object>plan.entries, event_id)
                    if found != NULL:
                        memcpy(&expires_at, PyBytes_AS_STRING(<bytes>found), 8)
                        native = expires_at <= now   # live: a duplicate, the reference answers
                if native:
                    if plan.policy == POLICY_SUM:
                        native = (sub.score is None and _number(sub.delta, &value)
                                  and not (plan.has_max_delta and fabs(value) > plan.max_delta))
                    else:
                        native = sub.delta is None and _number(sub.score, &value)
            if native:
                member_data = _chars(member)
                member_size = PyUnicode_GET_LENGTH(member)
                for i in range(plan.nwindows):
                    if plan.windows[i].index == NULL:
                        changes[i].had = False
                    else:
                        index = <RankIndex>plan.windows[i].index
                        changes[i].had = index.c_get(member_data, member_size, &changes[i].old)
                    if not _new_score(plan, changes[i].had, changes[i].old, value,
                                      &changes[i].new):
                        native = False
                        break
            if not native:
                try:
                    answer = _ingest_one(boards, sub, now, now_ms, lsn, dedupe_ttl, ts_tolerance,
                                         payloads)
                except _EngineError as error:
                    answers.append(error)
                    rejected += 1
                else:
                    if answer["duplicate"]:
                        duplicates += 1
                    else:
                        names.add(name)
                    answers.append(answer)
                # The reference may have opened periods: plan again.
                nplans = 0
                plan_of.clear()
                keep = []
                continue

            # The native path: nothing can fail from here on but memory.
            nupdates = 0
            primary_rank = 0
            rank = 0
            for i in range(plan.nwindows):
                updated = not changes[i].had or changes[i].new != changes[i].old
                if updated:
                    nupdates += 1
                    if plan.windows[i].index == NULL:
                        created = (<object>plan.board).index_for_write(
                            <object>plan.windows[i].name, <object>plan.windows[i].period)
                        keep.append(created)
                        plan.windows[i].index = <PyObject *>created
                    index = <RankIndex>plan.windows[i].index
                    rank = index.c_put(member_data, member_size, changes[i].new, lsn)
                if plan.windows[i].primary:
                    primary_had = changes[i].had
                    primary_old = changes[i].old
                    primary_new = changes[i].new
                    if updated:
                        primary_rank = rank
                    else:
                        primary_rank = (<RankIndex>plan.windows[i].index).c_rank(
                            member_data, member_size)

            # The WAL record (rankd.engine.records), as the packer writes it.
            w.size = 0
            put_array(&w, RECORD_ITEMS)
            put_int(&w, SUBMIT)
            _put_text(&w, plan.name)
            put_str(&w, member_data, member_size)
            put_float(&w, value)
            put_bool(&w, plan.policy == POLICY_SUM)
            if event_id is None:
                put_nil(&w)
            else:
                _put_text(&w, <PyObject *>event_id)
            put_int(&w, now_ms)
            put_int(&w, now_ms)
            if label is None:
                put_nil(&w)
            else:
                _put_text(&w, <PyObject *>label)
            put_array(&w, nupdates)
            for i in range(plan.nwindows):
                if not changes[i].had or changes[i].new != changes[i].old:
                    put_array(&w, 3)
                    _put_text(&w, plan.windows[i].name)
                    _put_text(&w, plan.windows[i].period)
                    put_float(&w, changes[i].new)
            put_array(&w, RESULT_ITEMS)
            put_float(&w, primary_new)
            put_int(&w, primary_rank)
            if primary_had:
                put_float(&w, primary_old)
            else:
                put_nil(&w)
            put_bool(&w, nupdates > 0)
            PyList_Append(payloads, PyBytes_FromStringAndSize(w.data, w.size))

            # What the record changes besides the indexes (ingest.note_submit).
            if label is not None:
                PyDict_SetItem(<object>plan.labels, member, label)
            if event_id is not None:
                entry = dedupe_entry(<double>now_ms / 1000.0 + dedupe_ttl, True, primary_new,
                                     primary_had, primary_old, True, primary_rank,
                                     nupdates > 0, member_data, member_size)
                # One probe of a table of millions in the common case, a new id.
                if PyDict_SetDefault(<object>plan.entries, event_id, entry) is not <PyObject *>entry:
                    PyDict_DelItem(<object>plan.entries, event_id)  # last: expiry order
                    PyDict_SetItem(<object>plan.entries, event_id, entry)
            if nupdates:
                board = <object>plan.board
                board.version += 1
                board.updated_at = <double>now_ms / 1000.0
            names.add(name)
            answers.append(_answer(member, event_id, primary_new, primary_rank,
                                   primary_old if primary_had else None, nupdates > 0))
    finally:
        writer_free(&w)
    return _Ingested(answers, payloads, names, rejected, duplicates)
