"""The engine: the one place where leaderboard state changes.

Front-ends (REST, live feed, TCP) call :class:`Engine`; the engine applies
changes to the rank indexes, logs them to the write-ahead log, snapshots
them and ships them to Postgres.

==============  ==========================================================
``engine``      boards, submissions, reads, recovery, snapshot scheduling
``submission``  the :class:`Submission` value front-ends hand the engine
``coalescer``   merges concurrent callers' submissions into one batch
``ingest``      how a batch of submissions changes the boards (native
                ``_ingest`` when built)
``board``       one board's windows, periods, labels and dedupe table
``config``      board configuration and its validation
``periods``     UTC windows (all/daily/weekly/monthly) and period ids
``records``     the msgpack records written to the WAL
``wal``         segmented, checksummed write-ahead log with group commit
``frames``      the WAL's on-disk record framing and its scanner (native
                ``_frames`` when built)
``replay``      recovery's replay of SUBMIT records (native ``_replay``
                when built)
``snapshot``    atomic snapshot files
``dedupe``      event-id table with a TTL (its store native ``_dedupe``
                when built)
``postgres``    schema, WAL shipping and restore (optional)
``groups``      which board group a board name belongs to (the cluster
                routes and logs by group)
``errors``      the errors front-ends map to responses
``collector``   garbage-collector settings for a process holding big boards
==============  ==========================================================
"""

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.errors import EngineError
from rankd.engine.submission import Submission

__all__ = ["Engine", "EngineConfig", "EngineError", "Submission"]
