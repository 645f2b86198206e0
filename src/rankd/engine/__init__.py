"""The engine: the one place where leaderboard state changes.

Front-ends (REST, live feed, TCP) call :class:`Engine`; the engine applies
changes to the rank indexes, logs them to the write-ahead log, snapshots
them and ships them to Postgres.

==================  ========================================================
``engine``          :class:`Engine`, the façade: builds the rooms below and
                    forwards its methods to them (ARCHITECTURE.md)
``settings``        :class:`EngineConfig` and the tunables
``core``            what every room reads (config, clock, the current WAL,
                    the cluster seam, life-cycle flags)
``state``           room: the boards and how a logged record changes them
``replaying``       room: logged records applied again (recovery, followers)
``recovery``        room: the data dir's lock, snapshot + WAL replay, take-back
``failure``         room: read-only after a storage failure, the roll-back
``commits``         room: the pass's one WAL append and acknowledgements
``submits``         room: submissions in every shape, onto one path
``changes``         room: board changes, removals, expiry, transactions, stores
``replicated``      room: a cluster node's writes and follower steps
``queries``         room: reads (views, pages, standings, ranks, digest)
``snapshotting``    room: taking snapshots, dropping covered WAL segments
``housekeeping``    room: retention, archives, active expiry
``host``            what transactions and stores need of the write path
``transaction``     writes applied in one step, logged as one record
``staging``         boards built in steps and swapped in at once
``submission``      the :class:`Submission` value front-ends hand the engine
``coalescer``       merges concurrent callers' submissions into one batch
``ingest``          how a batch of submissions changes the boards (native
                    ``_ingest`` when built)
``board``           one board's windows, periods, labels and dedupe table
``config``          board configuration and its validation
``periods``         UTC windows (all/daily/weekly/monthly) and period ids
``records``         the msgpack records written to the WAL
``wal``             segmented, checksummed write-ahead log with group commit
``frames``          the WAL's on-disk record framing and its scanner (native
                    ``_frames`` when built)
``replay``          recovery's replay of SUBMIT records (native ``_replay``
                    when built)
``snapshot``        atomic snapshot files
``dedupe``          event-id table with a TTL (its store ``idstore``: keyed
                    fingerprints, native ``_idstore`` when built)
``postgres``        schema, WAL shipping and restore (optional)
``groups``          which board group a board name belongs to (the cluster
                    routes and logs by group)
``errors``          the errors front-ends map to responses
``collector``       garbage-collector settings for a process holding big boards
==================  ========================================================
"""

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.errors import EngineError
from rankd.engine.submission import Submission

__all__ = ["Engine", "EngineConfig", "EngineError", "Submission"]
