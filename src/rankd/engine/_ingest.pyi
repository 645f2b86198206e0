"""Type stub for the native ingest kernel (see rankd.engine.ingest)."""

from collections.abc import Iterable

from rankd.engine.board import Board
from rankd.engine.engine import Submission
from rankd.engine.ingest import Ingested

def ingest(boards: dict[str, Board], submissions: Iterable[Submission], now: float,
           first_lsn: int, dedupe_ttl: float, ts_tolerance: float) -> Ingested: ...
