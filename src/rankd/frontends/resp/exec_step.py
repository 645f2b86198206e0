"""What the commands of one ``EXEC`` see: the engine whose writes go to
the transaction, and what the step may still do.

:mod:`.transactions` runs an ``EXEC``'s queued commands in one step of the
event loop with the connection's service swapped for one over
:class:`TransactionEngine` (:func:`transaction_service`): reads as ever,
writes applied by the :class:`rankd.engine.transaction.Transaction` at
once.  A command that computes in the step (the aggregations and stores of
:mod:`.aggregates`) or must not wait in it (a blocking pop, :mod:`.pops`)
asks :func:`running` whether it runs inside ``EXEC``, and spends the step's
budget (:data:`MAX_STEP_READ`, :data:`MAX_STEP_STORED`).

Owned here, below the command modules and :mod:`.transactions` (which
imports them), so that a command may ask without importing MULTI/EXEC.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rankd.engine.errors import EngineError
from rankd.frontends.resp.arguments import CommandError
from rankd.frontends.resp.limits import MAX_PAIRS, STEP_ENTRIES

if TYPE_CHECKING:
    from rankd.engine.transaction import Transaction
    from rankd.engine.view import SortedView
    from rankd.frontends.resp.context import Context

#: Entries the aggregations of one EXEC may read in its step (the stores
#: whose inputs the transaction writes, and the aggregations it answers;
#: the other stores are computed before the step).
MAX_STEP_READ = 8 * STEP_ENTRIES
#: Members the stores of one EXEC may write (applied in its step): one
#: store's bound outside MULTI.
MAX_STEP_STORED = MAX_PAIRS


class TransactionEngine:
    """The engine as the commands of an EXEC see it: reads as ever, writes
    applied by the transaction (its methods complete without waiting); and
    what the step may still do (see the module docstring)."""

    def __init__(self, engine: Any, transaction: Transaction,
                 precomputed: dict[int, Any]) -> None:
        self._engine = engine
        self._transaction = transaction
        #: Stores computed before the step, by ``id`` of their words.
        self.precomputed = precomputed
        self.read_left = MAX_STEP_READ
        self.stored_left = MAX_STEP_STORED

    def spend_read(self, entries: int) -> None:
        """An aggregation computed in the step reads ``entries`` entries."""
        if entries > self.read_left:
            raise CommandError(
                f"ERR rankd computes at most {MAX_STEP_READ} entries of aggregations in the "
                "step of one EXEC (ZUNION, ZINTER, ZDIFF, ZINTERCARD, and stores whose inputs "
                "the transaction writes); run this one outside the transaction")
        self.read_left -= entries

    def spend_stored(self, members: int) -> None:
        """A store writes ``members`` members in the step."""
        if members > self.stored_left:
            raise CommandError(f"ERR rankd stores at most {MAX_STEP_STORED} members in one "
                               "EXEC (they are written in one step); store fewer")
        self.stored_left -= members

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def submit_many(self, submissions: Iterable[Any]) -> list[Any]:
        return self._transaction.submit(list(submissions))

    async def submit(self, submission: Any) -> dict[str, Any]:
        (answer,) = self._transaction.submit([submission])
        if isinstance(answer, EngineError):
            raise answer
        return answer

    async def put_board(self, name: str, config: object, *, discard: bool = False,
                        patch: bool = False) -> tuple[Any, bool]:
        return self._transaction.put_board(name, config)

    async def delete_board(self, name: str) -> None:
        self._transaction.drop_board(name)

    async def expire(self, name: str, deadline: int | None, condition: int = 0) -> bool:
        return self._transaction.expire(name, deadline, condition)

    async def replace_board(self, name: str, config: object,
                            entries: Callable[[], Iterable[tuple[str, float]]]) -> int:
        return self._transaction.replace_board(name, config, entries)

    async def route(self, name: object) -> None:
        """Nothing: the transaction was routed whole (``Transaction.ready``)."""

    def stage(self, name: str, config: object) -> Any:
        raise CommandError("ERR rankd cannot store a result inside a transaction yet")

    async def remove_members(self, name: str, choose: Callable[[SortedView], Iterable[str]],
                             *, window: str | None = None, period: str | None = None,
                             drop_when_empty: bool = False, persist_when_empty: bool = False
                             ) -> list[tuple[str, float]]:
        removed = self._transaction.remove_members(name, choose, window=window, period=period,
                                                   persist_when_empty=persist_when_empty)
        if drop_when_empty and removed and not any(
                len(index) for periods in self._engine.boards[name].periods.values()
                for index in periods.values()):
            self._transaction.drop_board(name)
        return removed

    def remove_members_now(self, *args: Any, **kwargs: Any) -> None:
        """Never at once, outside the transaction: its ``remove_members``."""
        return None


def transaction_service(service: Any, transaction: Transaction,
                        precomputed: dict[int, Any]) -> Any:
    """The connection's service for the commands of one EXEC: the same,
    over :class:`TransactionEngine`."""
    inside = copy.copy(service)
    inside.engine = TransactionEngine(service.engine, transaction, precomputed)
    return inside


def running(conn: Context) -> TransactionEngine | None:
    """What an EXEC running ``conn``'s commands now may still do; None
    outside EXEC."""
    engine = conn.service.engine
    return engine if type(engine) is TransactionEngine else None
