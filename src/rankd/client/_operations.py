"""The client's methods, shared by the asyncio and the blocking client.

Each method only builds ``(op, args, idempotent)`` and hands it to
``self._call``: on :class:`AsyncClient` that returns an awaitable, on
:class:`Client` the result itself.
"""

from __future__ import annotations

from typing import Any


def _drop_none(**args: Any) -> dict[str, Any]:
    return {name: value for name, value in args.items() if value is not None}


class Operations:
    """Every operation of the protocol."""

    def _call(self, op: str, args: dict[str, Any], idempotent: bool) -> Any:
        raise NotImplementedError

    def health(self) -> Any:
        return self._call("health", {}, True)

    def list_boards(self, *, limit: int | None = None, after: str | None = None) -> Any:
        """``{"boards": [board info, ...], "next": name or None}``: a page of
        boards by name; pass ``next`` as ``after`` for the following one."""
        return self._call("list_boards", _drop_none(limit=limit, after=after), True)

    def get_board(self, board: str, *, min_seq: int | None = None) -> Any:
        """Config, member counts per window, version.  ``min_seq`` (every
        read takes it): on a cluster, answer once the node applied that
        position of the board's group (a write's ``seq``)."""
        return self._call("get_board", _drop_none(board=board, min_seq=min_seq), True)

    def put_board(self, board: str, config: dict[str, Any] | None = None, *,
                  discard: bool = False) -> Any:
        """Create or change a board: ``{"created": bool, "board": info}``.
        A change that would lose data raises ``Conflict`` unless ``discard``."""
        return self._call("put_board", _drop_none(board=board, config=config or {},
                                                  discard=discard or None), True)

    def patch_board(self, board: str, config: dict[str, Any], *, discard: bool = False
                    ) -> Any:
        """Change only the fields of ``config`` (see :meth:`put_board`)."""
        return self._call("patch_board", _drop_none(board=board, config=config,
                                                    discard=discard or None), True)

    def delete_board(self, board: str) -> Any:
        return self._call("delete_board", {"board": board}, False)

    def submit(self, board: str, member: str, *, score: float | None = None,
               delta: float | None = None, event_id: str | None = None,
               ts: float | None = None, label: str | None = None,
               signature: str | None = None) -> Any:
        """Submit a score (or a delta): the member's new score and rank.

        With an ``event_id`` the submission is idempotent: retried after a
        lost connection, it is applied at most once.  A board created with
        ``"signed": true`` needs a ``signature`` (:func:`rankd.client.sign`).
        """
        args = _drop_none(board=board, member=member, score=score, delta=delta,
                          event_id=event_id, ts=ts, label=label, signature=signature)
        return self._call("submit", args, event_id is not None)

    def submit_many(self, events: list[dict[str, Any]], *, board: str | None = None) -> Any:
        """Many submissions in one request: ``{"results": [...]}``, each a
        result or ``{"error": {"code", "message"}}``.  ``board`` fills in
        events that name none."""
        if board is not None:
            events = [event if "board" in event else {**event, "board": board}
                      for event in events]
        idempotent = all(event.get("event_id") is not None for event in events)
        return self._call("submit_many", {"events": events}, idempotent)

    def top(self, board: str, *, limit: int = 10, offset: int = 0,
            window: str | None = None, period: str | None = None,
            min_seq: int | None = None) -> Any:
        return self._call("top", _drop_none(board=board, limit=limit, offset=offset,
                                            window=window, period=period, min_seq=min_seq),
                          True)

    def member(self, board: str, member: str, *, window: str | None = None,
               period: str | None = None, min_seq: int | None = None) -> Any:
        """Score, ranks (unique, competition, dense), percentile; ``NotFound`` if absent."""
        return self._call("member", _drop_none(board=board, member=member, window=window,
                                               period=period, min_seq=min_seq), True)

    def around(self, board: str, member: str, *, above: int = 4, below: int = 4,
               window: str | None = None, period: str | None = None,
               min_seq: int | None = None) -> Any:
        return self._call("around", _drop_none(board=board, member=member, above=above,
                                               below=below, window=window, period=period,
                                               min_seq=min_seq), True)

    def ranks(self, board: str, members: list[str], *, window: str | None = None,
              period: str | None = None, min_seq: int | None = None) -> Any:
        """A friends board: the given members ordered, global and list ranks."""
        return self._call("ranks", _drop_none(board=board, members=list(members),
                                              window=window, period=period, min_seq=min_seq),
                          True)

    def remove_member(self, board: str, member: str) -> Any:
        return self._call("remove_member", {"board": board, "member": member}, False)

    def periods(self, board: str, *, window: str | None = None) -> Any:
        return self._call("periods", _drop_none(board=board, window=window), True)
