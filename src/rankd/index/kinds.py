"""Which rank index the boards of this process are built with.

Owns the choice between the two native layouts of the same contract
(:mod:`rankd.index._contract`): ``pages``, the compact paged index
(``rankd._pages``: entries packed in pages, names stored once; the
default), and ``skiplist``, one node per member (``rankd._skiplist``).  The daemon
chooses once, from its ``index`` setting (:class:`rankd.engine.settings.
EngineConfig`), and every board it creates or loads from a snapshot then
uses that class: one choice a process, like the native-or-Python choice of
:mod:`rankd._native` (``RANKD_PURE_PYTHON=1`` makes both kinds the
pure-Python fallback).

Design: the engine's native fast paths (``engine/_ingest.pyx``, ``_reads.pyx``,
``frontends/_rest_reads.pyx``, ``resp/_pops.pyx``) serve both kinds through
their C entry points (``rankd/_skiplist.pxd``'s ``c_*`` methods and node
walks, ``rankd/_pages.pxd``'s ``pg_*`` functions), choosing once per board;
for any other index class (the pure-Python fallback) they take their
general path, which calls the contract API only.  Both kinds read each
other's snapshots (dump versions 1 and 2).

A board's indexes of the paged kind share one name arena
(``rankd._pages.Names``: each name stored once a board, not once a window
and period): :func:`new_names` makes one for a board, and :func:`sharing`
gives the keyword that hands it to a constructor or a load of a class
that takes it, none to a class that does not.
"""

from __future__ import annotations

import sys
from typing import Any

from rankd._native import native_or
from rankd.index._fallback import RankIndex as _PurePythonIndex

#: The layouts ``index`` may name, the default first.
INDEX_KINDS = ("pages", "skiplist")

_MODULES = {"skiplist": "rankd._skiplist", "pages": "rankd._pages"}
_chosen: list = []  # [kind, class] once chosen; empty: the default


def index_class(kind: str) -> type:
    """The ``RankIndex`` class of ``kind`` (one of :data:`INDEX_KINDS`): the
    native one when it was compiled and pure Python is not forced, else the
    pure-Python fallback.  ``ValueError`` for an unknown kind."""
    if kind not in _MODULES:
        raise ValueError(f"index must be one of {', '.join(INDEX_KINDS)}, got {kind!r}")
    found, _ = native_or(_MODULES[kind], "RankIndex", _PurePythonIndex)
    return found


def use(kind: str) -> None:
    """Build every board of this process from now on with ``kind``'s index."""
    cls = index_class(kind)
    _chosen[:] = [kind, cls]


def current() -> type:
    """The index class boards are built with (see :func:`use`)."""
    if not _chosen:
        use(INDEX_KINDS[0])
    return _chosen[1]


def current_kind() -> str:
    """The name of the kind :func:`current` builds (see :data:`INDEX_KINDS`)."""
    current()
    return _chosen[0]


def _arena_class(cls: type) -> type | None:
    # The kind's arena class, in the module of its index (None: no sharing).
    module = sys.modules.get(cls.__module__)
    return getattr(module, "Names", None)


def new_names(cls: type | None = None) -> Any:
    """A name arena for one board's indexes of ``cls`` (the current class
    if not given), or None if that class keeps its names itself."""
    arena = _arena_class(current() if cls is None else cls)
    return None if arena is None else arena()


def sharing(cls: type, names: Any) -> dict[str, Any]:
    """The keyword arguments that make an index of ``cls`` (its constructor,
    ``load`` or ``load_chunks``) share ``names``: none if ``names`` is None
    or not ``cls``'s kind of arena."""
    arena = _arena_class(cls)
    if arena is None or not isinstance(names, arena):
        return {}
    return {"names": names}
