"""The bounds the RESP commands share: how large a reply may be, what a
rate-limit request pays for, how much of a reply is built in one step of
the event loop, and Redis's small-set encoding bound.

Owned here, below every command module (:mod:`.sorted_sets`, :mod:`.lex`,
:mod:`.exec_step`...), so that each may read them without importing
another; this module imports nothing.
"""

#: Entries one range reply may hold (Redis has no cap; a reply of every
#: member of a million-member board is 30 MB built in memory).
MAX_REPLY_ENTRIES = 100_000
#: Bytes one reply may hold (100,000 entries of long members would be 30 MB).
MAX_REPLY_BYTES = 16 << 20
#: Entries read or returned that one request of the read (or write) rate
#: limit pays for.  The engine's native reads answer ranges up to this
#: size only (``rankd.engine._reads``), charged one request each.
ENTRIES_PER_REQUEST = 100
#: Entries (or ZMSCORE members) a reply is built from before the event loop
#: serves other clients (about a millisecond of work).
STEP_ENTRIES = 2048
#: A reply built in steps is started again when its board changed between
#: two steps (so it is one state's, as in Redis); past this many restarts
#: it is built in one go.
STEP_RESTARTS = 2
#: Board names a FLUSHDB/FLUSHALL audit line lists (then how many more).
AUDIT_NAMES = 50
#: Score-member pairs in one ZADD: the engine's batch limit.
MAX_PAIRS = 10_000
#: ZSCAN answers boards up to this size in one reply, cursor 0, as Redis
#: does for its small (listpack-encoded) sorted sets.
SCAN_WHOLE = 128
