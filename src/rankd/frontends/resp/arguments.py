"""Reading command arguments the way Redis reads them.

Clients (and the tests, which compare every reply with a real
``redis-server``) depend on exactly what Redis accepts: ``ZADD`` scores go
through a strict ``strtod`` (no blanks, no overflow, no NaN), score-range
bounds through a lenient one (an empty bound is 0), integers through
``string2ll`` (no ``+``, no leading zeros), and patterns through
``stringmatchlen``'s glob.  Each reader raises :class:`CommandError` with
Redis's own reply text.
"""

from __future__ import annotations

import math
import re

from rankd.frontends.resp import glob

#: Redis's reply texts for bad arguments.
SYNTAX = "ERR syntax error"
NOT_FLOAT = "ERR value is not a valid float"
NOT_INTEGER = "ERR value is not an integer or out of range"
BOUND_NOT_FLOAT = "ERR min or max is not a float"
NOT_POSITIVE = "ERR value is out of range, must be positive"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Each of these reads a number in one pass: no two parts of a pattern can
# take the same digits (``[0-9]+\.?[0-9]*`` could split a run of digits
# n ways, and backtracked through all of them on "111...1x": 10 s of the
# event loop for 16,000 digits).
_DECIMAL = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEXADECIMAL = re.compile(
    rb"([+-]?)0[xX]((?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+))(?:[pP]([+-]?[0-9]+))?")
_INFINITY = re.compile(rb"([+-]?)(?:inf|infinity)", re.IGNORECASE)
_NAN = re.compile(rb"[+-]?nan(?:\([0-9A-Za-z_]*\))?", re.IGNORECASE)
_C_SPACE = b" \t\n\v\f\r"


class CommandError(Exception):
    """A command refused: its reply is ``-<text>``."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


#: The longest number read (a double needs at most a few dozen characters;
#: a megabyte of digits would still cost the event loop 0.15 s to read).
MAX_NUMBER_CHARS = 4096


def _strtod(text: bytes) -> tuple[float, bool] | None:
    """What C's ``strtod`` makes of all of ``text`` (no blanks around):
    ``(value, out_of_range)``, or None if ``text`` is not one number (or is
    longer than :data:`MAX_NUMBER_CHARS`)."""
    if len(text) > MAX_NUMBER_CHARS:
        return None
    if _DECIMAL.fullmatch(text):
        value = float(text)
        mantissa = text.split(b"e")[0].split(b"E")[0]
        underflow = value == 0 and any(c in b"123456789" for c in mantissa)
        return value, math.isinf(value) or underflow
    found = _HEXADECIMAL.fullmatch(text)
    if found:
        sign, digits, exponent = found.groups()
        whole, _, fraction = digits.partition(b".")
        try:
            value = float.fromhex(f"{sign.decode()}0x{whole.decode() or '0'}."
                                  f"{fraction.decode() or '0'}p{(exponent or b'0').decode()}")
        except OverflowError:
            return math.copysign(math.inf, -1.0 if sign == b"-" else 1.0), True
        underflow = value == 0 and any(c not in b"0." for c in digits)
        return value, underflow
    found = _INFINITY.fullmatch(text)
    if found:
        return (-math.inf if found.group(1) == b"-" else math.inf), False
    if _NAN.fullmatch(text):
        return math.nan, False
    return None


def score(word: bytes) -> float:
    """A score or increment, as ``getDoubleFromObject`` reads it: all of the
    word one number, no leading blank, not out of range, not NaN."""
    if not word or word[0] in _C_SPACE:
        raise CommandError(NOT_FLOAT)
    parsed = _strtod(word)
    if parsed is None:
        raise CommandError(NOT_FLOAT)
    value, out_of_range = parsed
    if (out_of_range and (math.isinf(value) or value == 0)) or math.isnan(value):
        raise CommandError(NOT_FLOAT)
    return value


def bound(word: bytes) -> tuple[float, bool]:
    """A score-range bound as ``zslParseRange`` reads it: ``(value,
    exclusive)``; a ``(`` makes it exclusive, leading blanks are skipped,
    an empty bound is 0, overflow is infinity, NaN is refused."""
    exclusive = word[:1] == b"("
    if exclusive:
        word = word[1:]
    stripped = word.lstrip(_C_SPACE)
    if not word:
        return 0.0, exclusive
    parsed = _strtod(stripped) if stripped else None
    if parsed is None or math.isnan(parsed[0]):
        raise CommandError(BOUND_NOT_FLOAT)
    return parsed[0], exclusive


def integer(word: bytes, error: str = NOT_INTEGER) -> int:
    """A signed 64-bit integer as ``string2ll`` reads it."""
    size = len(word)
    if 0 < size < 21:
        if word == b"0":
            return 0
        digits = word[1:] if word[:1] == b"-" else word
        if digits and 0x31 <= digits[0] <= 0x39 and digits.isdigit():
            value = int(word)
            if _INT64_MIN <= value <= _INT64_MAX:
                return value
    raise CommandError(error)


def positive(word: bytes) -> int:
    """A count that must not be negative (``getPositiveLongFromObject``:
    one message for both a bad integer and a negative one)."""
    value = integer(word, NOT_POSITIVE)
    if value < 0:
        raise CommandError(NOT_POSITIVE)
    return value


def text(word: bytes) -> str | None:
    """A key or member as text (rankd's names are UTF-8); None if it is not
    UTF-8, so no board or member can have that name."""
    try:
        return word.decode()
    except UnicodeDecodeError:
        return None


def glob_match(pattern: bytes, subject: bytes, nocase: bool = False) -> bool:
    """Redis's ``stringmatchlen`` (``*``, ``?``, ``[...]`` with ``^`` and
    ranges, ``\\`` escapes) in linear time (:mod:`.glob`); a pattern too
    long to be useful is a ``CommandError``."""
    try:
        return glob.glob_match(pattern, subject, nocase)
    except glob.PatternTooLong as exc:
        raise CommandError(str(exc)) from None
