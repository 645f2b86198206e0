"""Type stub for the native ingest kernel (see rankd.engine.ingest)."""

from collections.abc import Iterable
from typing import Any

from rankd.engine.board import Board
from rankd.engine.ingest import Ingested
from rankd.engine.submission import Submission

def ingest(boards: dict[str, Board], submissions: Iterable[Submission], now: float,
           first_lsn: int, dedupe_ttl: float, ts_tolerance: float) -> Ingested: ...

def ingest_packed(boards: dict[str, Board], runs: list[Any], now: float, first_lsn: int,
                  dedupe_ttl: float, ts_tolerance: float) -> Ingested: ...
