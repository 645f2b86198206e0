"""What the engine needs from a cluster to write as one of its nodes.

A cluster node's engine (``Engine.replication`` set) gives every record of a
board group its place in that group's log, ``seq``, from the group's
:class:`GroupWriter`, instead of its local log position: every node then
applies a record at the same position, and the indexes (whose arrival
order is that position) and board versions come out identical on all of
them.  The local write-ahead log keeps each record wrapped with its
``(group, seq, epoch)`` (``records.REPLICATED``).

The engine knows nothing of Postgres, leases or other nodes: the cluster
(:mod:`rankd.cluster.node`) implements these two protocols.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from rankd.engine.errors import EngineError


class GroupWriter(Protocol):
    """This node's right to write one group, while it is the primary."""

    group: int
    epoch: int
    #: The position the next record of the group gets.
    next_seq: int
    #: The last position known committed to the group's log.
    committed_seq: int

    def enqueue(self, payloads: list[bytes]) -> int:
        """Send records to the group's log at the next positions; return the
        first position."""

    def committed(self, seq: int) -> asyncio.Future[int]:
        """Done once position ``seq`` committed to the group's log."""


class Replication(Protocol):
    """The cluster as the engine sees it."""

    #: ``log``: acknowledge a write once its group's log committed it;
    #: ``local``: once the local log holds it (by the fsync policy).
    ack: str
    #: Seconds a write waits for the log before it is answered
    #: ``Unacknowledged``.
    ack_timeout: float

    #: False while the node catches up at start: reads answer ``Unavailable``.
    serving: bool

    async def prepare(self, groups: set[int], *, take: bool = True
                      ) -> dict[int, EngineError]:
        """Before writing ``groups``: become the primary of those no node
        holds (draining their logs first).  Without ``take`` (writes that
        cannot apply here): only learn which node writes them, if any.
        Returns why each group that cannot be written now is refused
        (nothing of it is applied); the other groups' writes go on."""

    def check_read(self, group: int, board: str) -> None:
        """Before a read of ``board`` (of ``group``): raise ``Unsettled``
        if it would show writes this node applied that the group's log has
        not committed (``--ack log``; a front-end then waits with
        ``Engine.settle``), ``Unavailable`` if this node cannot answer it
        truthfully now (the group is being rebuilt, or not fresh enough)."""

    def settling(self, group: int) -> asyncio.Future | None:
        """The commit of the last record of ``group`` applied here, when a
        read must wait for it (None: nothing to wait for)."""

    #: Whether packed plain reads may be answered natively, with no
    #: ``check_read`` each (every group readable as it is).
    reads_natively: bool

    def writer(self, group: int) -> GroupWriter:
        """The group's writer; ``NotPrimary`` (naming the primary) if
        another node writes it."""

    def awaited(self, group: int) -> None:
        """A read waits for a position of ``group`` this node has not applied
        yet: apply the group's log without delay."""

    def check_acknowledge(self, group: int) -> None:
        """Under ``--ack local``: raise ``Unacknowledged`` when this node may
        no longer acknowledge writes of ``group`` (its lease is about to run
        out, or too much of its log is not shipped)."""
