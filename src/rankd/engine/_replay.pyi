"""Type stub for the native replay of SUBMIT records (see rankd.engine.replay)."""

from rankd.engine.board import Board
from rankd.engine.replay import Pending

def replay_submits(
    board: Board,
    batch: list[tuple[int, bytes]],
    start: int,
    dedupe_ttl: float,
    pending: Pending,
) -> tuple[int, int]: ...
