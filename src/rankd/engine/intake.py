"""The front door of the engine's packed path, and this pass's runs.

A front-end that reads writes in packed form (a TCP or RESP lane) asks
:meth:`Intake.takes` whether the engine's packed path may take a run, then
hands it over with :meth:`Intake.submit_then`; the engine's pass
(``Engine._run_pass``) takes the runs gathered with :meth:`Intake.take_pass`
and tells their callers how it ended with :meth:`Intake.tell`.  The native
intake commits the common pass of a single node itself (``commit_pass``,
as ``Engine._run_pass`` would), reading the engine's state for it.  All of that
happens once per request of a client that does not pipeline, so it has a
native implementation, ``rankd.engine._intake``, chosen at import
(``RANKD_PURE_PYTHON=1`` forces this module's, which behaves the same).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from rankd._native import native_or

log = logging.getLogger("rankd.engine")

#: What a front-end hands over with a run: called ``then(token, error)``
#: once the run is committed (``error`` None) or cannot be.
Then = Callable[[Any, BaseException | None], None]


class IntakeOwner(Protocol):
    """What the intake asks its engine."""

    def takes_replicated(self, packed: Any) -> bool: ...


def boards_take(boards: Mapping[str, Any], names: Iterable[str], existing: bool) -> bool:
    """Whether boards ``names`` take packed runs: none takes only signed
    submissions, and, with ``existing``, every one exists."""
    for name in names:
        known = boards.get(name)
        if known is None:
            if existing:
                return False
        elif known.config.signed:
            return False
    return True


class PythonIntake:
    """The packed runs of this pass of the event loop, and the checks that
    let a run in (see the module docstring).

    ``held`` is the engine's set of boards whose writes wait for a snapshot
    (the same set, changed by the engine).  The engine keeps ``boards`` (its
    boards by name) and ``replicated`` (whether it is a cluster node) up to
    date, and counts in ``unpacked`` the runs gone the general way and not
    applied yet: while there are some, later runs go that way behind them.
    ``later(packed, then, token)`` takes what may not join the pass directly.
    """

    def __init__(self, engine: IntakeOwner, held: set[str], run_pass: Callable[[], None],
                 later: Callable[[Any, Then, Any], None]) -> None:
        self.engine = engine
        self.held = held
        self.boards: Mapping[str, Any] = {}
        self.replicated = False
        self.runs: list[Any] = []
        #: Each run's ``then`` and ``token``, one after the other (no tuple
        #: made per run).
        self.thens: list[Any] = []
        self.scheduled = False
        self.unpacked = 0
        #: Set by a single node's engine whose log hands records to the OS at
        #: once: the native intake then commits the common pass itself (its
        #: ``commit_pass``); here the engine's pass always does.
        self.commits_now = False
        #: Names of boards about to expire (``Engine.deadlines.expiring``):
        #: their writes go the general way, which compares their deadline
        #: with the clock.
        self.expiring: set[str] = set()
        self._run_pass = run_pass
        self._later = later
        #: The board of the last single-board run taken (see :meth:`takes`).
        self._last_taken: str | None = None

    def takes(self, packed: Any, existing: bool = False) -> bool:
        """Whether the packed path may take this run: not if one of its
        boards takes only signed submissions (packed runs carry no
        signature; those go the general way, which verifies them), nor on
        a cluster node for boards another node writes, nor, with
        ``existing``, if one of the boards does not exist, nor if one is
        about to expire."""
        boards = self.boards
        last = self._last_taken
        # The common case, a run to the board last taken, is checked again
        # (it may be gone or signed now) without a set of names made.
        names = (last,) if last is not None and packed.only_board(last) else \
            packed.board_names()
        if not boards_take(boards, names, existing):
            return False
        if self.expiring and not self.expiring.isdisjoint(names):
            return False
        if len(names) == 1:
            (name,) = names
            self._last_taken = name if name in boards else None
        return not self.replicated or self.engine.takes_replicated(packed)

    def submit_then(self, packed: Any, then: Then, token: Any) -> None:
        """``Engine.submit_packed_then``: the run joins this pass, or goes
        to ``later`` when it may not (a cluster node, runs gone the general
        way before it, a board a snapshot holds)."""
        held = self.held
        if (not self.replicated and not self.unpacked
                and (not held or held.isdisjoint(packed.board_names()))):
            self.runs.append(packed)
            self.thens.append(then)
            self.thens.append(token)
            if not self.scheduled:
                self.schedule()
            return
        self._later(packed, then, token)

    def schedule(self) -> None:
        """Run the pass once the callbacks already queued (the other reads
        of this turn of the loop) have run: their writes join it."""
        self.scheduled = True
        asyncio.get_running_loop().call_soon(self._run_pass)

    def take_pass(self) -> tuple[list[Any], list[Any]]:
        """This pass's runs and their callers, the intake emptied for the next."""
        runs, thens = self.runs, self.thens
        self.runs, self.thens, self.scheduled = [], [], False
        return runs, thens

    @staticmethod
    def tell(thens: list[Any], error: BaseException | None) -> None:
        """Call each ``then(token, error)`` of ``thens`` (as ``take_pass``
        returns them); one that raises is logged and does not keep the
        others from being told."""
        for then, token in zip(thens[::2], thens[1::2], strict=True):
            try:
                then(token, error)
            except Exception:  # one front-end's bug must not keep the others unanswered
                log.exception("a packed run's completion failed")


Intake, IMPLEMENTATION = native_or("rankd.engine._intake", "Intake", PythonIntake)
