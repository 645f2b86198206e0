"""The state's count of dropped boards (``BoardState.dropped_since``), which
tells a RESP ``WATCH`` that an absent key was made and dropped again."""

from __future__ import annotations

from rankd.engine import state as state_module
from rankd.engine.board import Board
from rankd.engine.config import BoardConfig
from rankd.engine.state import BoardState


def made(state: BoardState, name: str) -> None:
    state.boards[name] = Board(name, BoardConfig.from_dict({}))


def test_a_drop_is_seen_by_name_and_the_names_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(state_module, "MAX_DROPS_KEPT", 3)
    state = BoardState(lambda: 0.0)
    mark = state.drops
    made(state, "k")
    made(state, "other")
    state.forget("other")
    assert not state.dropped_since("k", mark) and state.dropped_since("other", mark)
    state.forget("k")
    assert state.dropped_since("k", mark)
    later = state.drops
    assert not state.dropped_since("k", later)
    state.forget("never-made")  # (no board: nothing dropped)
    assert state.drops == later
    # Gone in a replace (a roll-back) counts as dropped too.
    made(state, "r")
    state.replace({})
    assert state.dropped_since("r", later)
    # Past the bound the names are let go: any look from before then may
    # have missed a drop, so it is answered yes (an EXEC aborted, retried).
    for name in ("a", "b", "c", "d"):
        made(state, name)
        state.forget(name)
    assert len(state.dropped) <= 3
    assert state.dropped_since("k", later) and state.dropped_since("unrelated", later)
    assert not state.dropped_since("unrelated", state.drops)


def test_boards_made_again_have_new_serials():
    # id() of a freed board is given to the next one made; a serial is not.
    serials = set()
    for _ in range(100):
        board = Board("k", BoardConfig.from_dict({}))
        serials.add(board.serial)
        del board
    assert len(serials) == 100
