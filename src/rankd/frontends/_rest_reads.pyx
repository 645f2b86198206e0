# cython: language_level=3, boundscheck=False, wraparound=False
"""The REST hot route's native reads: a member's standing as the JSON bytes
``GET /v1/boards/{board}/members/{member}`` answers.

What it owns: :func:`standing_json`, the bytes ``orjson.dumps`` gives for
``Queries.standing``'s dict, read and written here with no dict made and
no JSON encoder called (numbers and text as ``_json.pxd`` writes them).
The member is found in the native index once; its unique and dense ranks
come from one walk down the skip list (``_rank_of``), its competition rank
and percentile from a second (``_count_before_key``), where the general
path looks it up six times and walks four: the same methods
``RankIndex.rank``, ``dense_rank``, ``competition_rank`` and
``percentile`` call, so the same numbers; a paged index (``--index
pages``) answers them all in one call of its entry point ``pg_standing``.
Anything but a native index (the pure-Python fallback) gives None: the caller answers the general way.
``tests/test_rest_hot.py`` compares its bytes with ``orjson.dumps`` of the
general path's dict.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize

from rankd._pages cimport pg_is, pg_length, pg_standing
from rankd._skiplist cimport MAX_MEMBER_BYTES, PyUnicode_AsUTF8AndSize, RankIndex, rk_node
from rankd.engine._packing cimport Writer, writer_free
from rankd.frontends._json cimport (
    json_double, json_integer, json_key, json_put, json_text,
)

import orjson

cdef object dumps = orjson.dumps


def double_json(double value):
    """``value`` as orjson writes it, by ``_json.pxd`` (for the tests)."""
    cdef Writer w
    w.data = NULL
    w.size = w.cap = 0
    try:
        json_double(&w, value)
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)


def standing_json(index, str member, label, str window, str period, version):
    """``orjson.dumps(Queries.standing(...))`` of ``member`` in ``index``
    (``label``, ``window``, ``period`` and the board's ``version`` as
    ``Queries.standing`` reads them); ``b""`` if the member is not in the
    index; None if ``index`` is not the native one."""
    cdef RankIndex rank_index
    cdef rk_node *x
    cdef Py_ssize_t dense = 0, rank, before = 0, total, size
    cdef double score = 0.0
    cdef const char *data
    cdef Writer w
    if pg_is(index):
        try:
            data = PyUnicode_AsUTF8AndSize(member, &size)
        except UnicodeEncodeError:
            return None  # (the general path says why)
        if not 0 < size <= MAX_MEMBER_BYTES:
            return None
        rank = pg_standing(index, data, size, &score, &dense, &before)
        if rank == 0:
            return b""
        total = pg_length(index)
    elif type(index) is RankIndex:
        rank_index = <RankIndex>index
        x = rank_index._find(member)
        if x == NULL:
            return b""
        rank = rank_index._rank_of(x, &dense)
        before = rank_index._count_before_key(x.key, False)
        total = rank_index.length
        score = rank_index._score(x)
    else:
        return None
    w.data = NULL
    w.size = w.cap = 0
    try:
        json_key(&w, "{\"member\":")
        json_text(&w, member, dumps)
        json_key(&w, ",\"score\":")
        json_double(&w, score + 0.0)  # (a -0 shows as 0, as the general path's)
        json_key(&w, ",\"rank\":")
        json_integer(&w, rank)
        json_key(&w, ",\"competition_rank\":")
        json_integer(&w, before + 1)
        json_key(&w, ",\"dense_rank\":")
        json_integer(&w, dense)
        json_key(&w, ",\"percentile\":")
        json_double(&w, 100.0 * (total - before) / total)
        json_key(&w, ",\"total\":")
        json_integer(&w, total)
        json_key(&w, ",\"label\":")
        json_text(&w, label, dumps)
        json_key(&w, ",\"window\":")
        json_text(&w, window, dumps)
        json_key(&w, ",\"period\":")
        json_text(&w, period, dumps)
        json_key(&w, ",\"version\":")
        json_integer(&w, version)
        json_put(&w, "}", 1)
        return PyBytes_FromStringAndSize(w.data, w.size)
    finally:
        writer_free(&w)
