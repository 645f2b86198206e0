"""The REST hot route's native JSON reader (``pack`` in
``rankd/frontends/_rest.pyx``) against the general path's parse
(``rest.decoded`` then ``Submission.from_dict``), and both submitted.

An input's first byte picks the mode, its second the board:

* raw (even first byte): the rest is the request body, as is;
* structured (odd first byte): the rest is read as choices building a
  JSON-like object close to a plain submission (keys and values from
  pools of plain and almost-plain tokens: escapes, non-ASCII, floats,
  exponents, leading zeros, 15 and 16 digits, duplicate and unknown keys,
  whitespace JSON has and has not, text after the object).

Properties, on every input:

* ``pack`` returns None or a run of one; when it reads a body, the general
  path decodes the same body into an object of the same keys, and the
  ``Submission`` it builds has the same member, delta, score and event id
  (types included: an integer stays an integer);
* a body built only of plain tokens (structured mode, an ASCII board) is
  read natively: the native reader takes every body its docstring says it
  takes, so the hot route is not silently slower;
* accepted or refused identically: two engines take the same bodies in the
  same order, one through ``Service.submit_json`` (natively when it reads
  the body, else the general way, as ``rest._submit_now`` does), the other
  always the general way; their answers (or errors: type, code, message)
  are equal as JSON, and so are the boards' digests.

The engines live in a temporary directory of the process (``fsync no``,
a fixed clock; removed by the next run once the process is gone) and are
opened again every :data:`REOPEN_EVERY` inputs, so memory stays bounded
however long the run.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from fuzz.targets import split

INSTRUMENT = ["rankd.frontends.rest", "rankd.frontends.service", "rankd.engine.submission"]
MAX_LEN = 4096
#: Inputs between two openings of the engines (bounds their memory).
REOPEN_EVERY = 5000
#: Board names (the second byte picks one): of each policy, one missing
#: (the packed path refuses it: the general way answers), one signed, and
#: names the native reader leaves to the general way (non-ASCII).
BOARDS = ("arena", "best-of", "latest-one", "missing", "signed", "été", "a" * 64)
POLICIES = {"arena": "sum", "best-of": "best", "latest-one": "latest",
            "signed": "sum", "été": "sum", "a" * 64: "sum"}
#: The engines' directory: this prefix and the fuzzing process's id.
ROOT_PREFIX = "rankd-fuzz-rest-"
#: The fixed time both engines read.
NOW = 1795348800.0

#: Plain tokens (the native reader takes them), then almost-plain ones.
PLAIN_KEYS = (b'"member"', b'"delta"', b'"score"', b'"event_id"')
OTHER_KEYS = (b'"ts"', b'"label"', b'"Member"', b'"member "', b'"memb\\u0065r"', b'"x"',
              b'member', b'"member', b'""', b'"delta\\""')
PLAIN_STRINGS = (b'"m1"', b'"m2"', b'"e1"', b'"e2"', b'"a b~!"', b'""', b'"' + b"z" * 40 + b'"',
                 b'"' + b"y" * 300 + b'"', b'"{}[],:"')
OTHER_STRINGS = (b'"m\\u0031"', b'"\\"q"', b'"caf\xc3\xa9"', b'"tab\there"', b'"m1\\n"',
                 b'"\xff"', b'"m1', b'"\x7f"', b"'m1'", b'"\\/"')
PLAIN_NUMBERS = (b"0", b"-0", b"1", b"-1", b"42", b"999999999999999", b"-999999999999999",
                 b"123456789012345", b"9007199")
OTHER_NUMBERS = (b"1.0", b"1e3", b"1E3", b"01", b"-", b"--1", b"+1", b"1234567890123456",
                 b"9007199254740993", b"99999999999999999999", b"1.5", b"-0.0", b"NaN",
                 b"Infinity", b"0x10", b"1_0", b"2e400")
OTHER_VALUES = (b"true", b"false", b"null", b"[]", b"{}", b'["m1"]', b'{"a":1}')
PLAIN_SPACE = (b"", b" ", b"\n", b"\t", b"\r\n  ")
OTHER_SPACE = (b"\x0b", b"\x0c", b"\xc2\xa0", b"\x00")
TRAILERS = (b"x", b",", b"}", b"{}", b"\x00", b"//", b"\xff")

pack: Any = None
rest: Any = None
engine_module: Any = None
submission_module: Any = None
errors: Any = None
service_module: Any = None
_twins: list[Any] = []
_count = [0]
_loop: Any = None
_root: Path | None = None


def load() -> Callable[[bytes], None]:
    global pack, rest, engine_module, submission_module, errors, service_module, _loop, _root
    from rankd.engine import engine as engine_mod
    from rankd.engine import errors as errors_mod
    from rankd.engine import submission as submission_mod
    from rankd.frontends import rest as rest_mod
    from rankd.frontends import service as service_mod

    pack = service_mod.pack_json
    assert pack is not None, "the native REST reader (_rest.pyx) is not built"
    rest, engine_module, submission_module = rest_mod, engine_mod, submission_mod
    errors, service_module = errors_mod, service_mod
    _loop = asyncio.new_event_loop()
    _root = _fresh_root()
    atexit.register(_close)
    _open()
    return test_one


class _Reader:
    """Choices read off the input's bytes (0 once they run out)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]

    def more(self) -> bool:
        return self.at < len(self.data)

    def pick(self, plain: tuple[bytes, ...], other: tuple[bytes, ...]) -> tuple[bytes, bool]:
        """A token: plain unless the choice byte's top bit says otherwise."""
        choice = self.byte()
        if choice & 0x80 and other:
            return other[(choice & 0x7F) % len(other)], False
        return plain[choice % len(plain)], True


def structured(data: bytes) -> tuple[bytes, bool]:
    """A body built from ``data``'s choices, and whether it is plain."""
    reader = _Reader(data)
    space = lambda: reader.pick(PLAIN_SPACE, OTHER_SPACE)  # noqa: E731
    parts: list[bytes] = []
    plain = True
    seen: set[bytes] = set()

    def add(token: tuple[bytes, bool]) -> None:
        nonlocal plain
        parts.append(token[0])
        plain &= token[1]

    add(space())
    parts.append(b"{")
    fields = reader.byte() % 6
    for index in range(fields):
        add(space())
        key, key_plain = reader.pick(PLAIN_KEYS, OTHER_KEYS)
        add((key, key_plain and key not in seen))
        seen.add(key)
        add(space())
        parts.append(b":")
        add(space())
        kind = reader.byte()
        if key in (b'"member"', b'"event_id"'):
            choices = (PLAIN_STRINGS, OTHER_STRINGS + OTHER_NUMBERS[:3] + OTHER_VALUES)
        elif key in (b'"delta"', b'"score"'):
            choices = (PLAIN_NUMBERS, OTHER_NUMBERS + OTHER_VALUES + PLAIN_STRINGS[:1])
        else:
            choices = (PLAIN_STRINGS + PLAIN_NUMBERS, OTHER_VALUES)
        if kind & 1:
            add(reader.pick(*choices))
        else:  # a number made of the input's digits, sign included
            digits = bytes(48 + reader.byte() % 10 for _ in range(1 + kind % 18))
            value = (b"-" if kind & 2 else b"") + digits
            numeric = key in (b'"delta"', b'"score"')
            add((value, numeric and len(digits) <= 15
                 and not (digits[0] == 48 and len(digits) > 1)))
        add(space())
        if index < fields - 1:
            parts.append(b",")
    parts.append(b"}")
    add(space())
    if reader.byte() & 0x80:
        add((TRAILERS[reader.byte() % len(TRAILERS)], False))
    return b"".join(parts), plain and b'"member"' in seen


def test_one(data: bytes) -> None:
    mode, choice, rest_of = split(data)
    board = BOARDS[choice % len(BOARDS)]
    if mode & 1:
        body, plain = structured(rest_of)
    else:
        body, plain = rest_of, False
    packed = pack(board, body)
    if packed is not None:
        assert len(packed) == 1, len(packed)
        same_parse(board, body, packed)
    elif plain and board.isascii():
        raise AssertionError(f"a plain body was not read natively: {body!r}")
    _submit_both(board, body)


def same_parse(board: str, body: bytes, packed: Any) -> None:
    """The general path reads ``body`` as ``packed`` does."""
    data = rest.decoded(body)  # raises if the native reader took what is not JSON
    assert isinstance(data, dict), data
    assert set(data) <= {"member", "delta", "score", "event_id"}, data
    general = submission_module.Submission.from_dict(board, data)
    native = packed.submission(0)
    for field in ("board", "member", "delta", "score", "event_id", "label"):
        ours, theirs = getattr(native, field), getattr(general, field)
        assert type(ours) is type(theirs) and ours == theirs, (field, ours, theirs, body)


def _submit_both(board: str, body: bytes) -> None:
    _count[0] += 1
    if _count[0] % REOPEN_EVERY == 0:
        _open()
    hot, general = _twins
    answers = _loop.run_until_complete(_answers(hot, general, board, body))
    # As the client reads them (1 and 1.0 are equal, their JSON is not).
    assert orjson.dumps(answers[0]) == orjson.dumps(answers[1]), (body, answers)
    if board in POLICIES:
        assert hot.engine.digest(board) == general.engine.digest(board), body


async def _answers(hot: Any, general: Any, board: str, body: bytes) -> list[Any]:
    return await asyncio.gather(_answer(hot, board, body, True),
                                _answer(general, board, body, False))


async def _answer(service: Any, board: str, body: bytes, native: bool) -> Any:
    """What ``rest._submit_now`` answers ``body`` (an error as its type,
    code and message)."""
    try:
        plain = service.submit_json(board, body) if native else None
        return await (service.submit(board, rest.decoded(body)) if plain is None else plain)
    except (errors.EngineError, rest.RequestError) as exc:
        return type(exc).__name__, getattr(exc, "code", None), str(exc)


def _open() -> None:
    """Both engines afresh (closing the previous ones), their boards made."""
    _close_engines()
    assert _root is not None
    shutil.rmtree(_root, ignore_errors=True)

    async def start() -> list[Any]:
        made = []
        for name in ("hot", "general"):
            config = engine_module.EngineConfig(
                data_dir=_root / name, fsync="no", snapshot_every_seconds=3600.0,
                housekeeping_seconds=3600.0)
            engine = await engine_module.Engine.open(config, clock=lambda: NOW)
            for board, policy in POLICIES.items():
                await engine.put_board(board, {"policy": policy,
                                               "signed": board == "signed"})
            made.append(service_module.Service(engine, signing_secret="s" * 32))
        return made

    _twins[:] = _loop.run_until_complete(start())


def _close_engines() -> None:
    if _twins:
        async def close() -> None:
            for twin in _twins:
                await twin.engine.close(snapshot=False)

        _loop.run_until_complete(close())
        _twins.clear()


def _fresh_root() -> Path:
    """This process's directory for the engines, after removing those of
    processes gone (libFuzzer ends a run without Python's exit handlers)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{ROOT_PREFIX}*"):
        pid = old.name[len(ROOT_PREFIX):]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    root = base / f"{ROOT_PREFIX}{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _close() -> None:
    # (At exit the loop's executor is shut down already: the engines are
    # dropped quietly, their files removed.)
    if _loop is not None:
        _loop.set_exception_handler(lambda loop, context: None)
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)
