"""Type stub for the native WAL frame scanner (see rankd.engine.frames)."""

def scan(
    data: bytes | bytearray | memoryview,
    first_lsn: int,
    check: bool,
    from_lsn: int,
    upto_lsn: int,
    limit: int,
    collect: bool,
) -> tuple[list[tuple[int, bytes]], int, int, tuple[int, str, bool] | None]: ...

def find_frame(data: bytes | bytearray | memoryview, start: int, min_lsn: int,
               max_lsn: int) -> int: ...
