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

def frame_into(buffer: bytearray, payloads: list[bytes], last_lsn: int, active: int,
               limit: int, rolls: list[tuple[int, int]]) -> tuple[int, int, int]: ...

def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...

def crc32c_portable(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...

def crc32c_hardware(data: bytes | bytearray | memoryview, crc: int = 0) -> int | None: ...

def has_hardware_crc32c() -> bool: ...

class Frames:
    """Records left in the buffer scanned: a sequence of ``(lsn, payload)``."""

    first_lsn: int
    payload_bytes: int
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> tuple[int, bytes]: ...

def scan_frames(
    data: bytes | bytearray | memoryview,
    first_lsn: int,
    check: bool,
    from_lsn: int,
    upto_lsn: int,
    limit: int,
) -> tuple[Frames, int, int, tuple[int, str, bool] | None]: ...
