"""Redis's glob patterns (``KEYS``, ``SCAN MATCH``, ``ZSCAN MATCH``,
``CONFIG GET``), matched in time linear in the pattern times the subject.

Redis's ``stringmatchlen`` backtracks: on a ``*`` it tries the rest of the
pattern at every later position, recursively, so ``*a*a*a*a*a*a*a*b``
against a long run of ``a`` takes exponential time (CVE-2022-36021; Redis
now caps the nesting).  A translation of it froze rankd for 10-17 s on a
20-byte pattern.  Here no backtracking is needed at all:

* A pattern is first read into *tokens*, each matching exactly one byte
  (a literal, ``?``, an escaped byte, a ``[...]`` class with Redis's
  quirks: ``^`` negates, ``a-z`` ranges in either order, ``\\`` escapes,
  an unterminated class runs to the pattern's end) or a ``*``.
* The ``*`` cut the tokens into *segments* of fixed length.  The first
  segment must match at the start of the subject, the last at its end,
  and each one between is taken at its leftmost match after the one
  before.  Leftmost is always right: any match further on leaves less
  room for the segments after it, never more.
* Each segment becomes one compiled regular expression with no
  quantifiers, whose search costs at most the subject's length times the
  segment's, in C.  A subject shorter than the fixed bytes of the pattern
  is refused before any search.

Patterns are compiled once and cached; one longer than
:data:`MAX_PATTERN_BYTES` is refused (names and members are at most a few
hundred bytes: such a pattern could match nothing useful).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: The longest pattern taken (its compiled form and its parsing are
#: linear in it; member names are at most 256 bytes).
MAX_PATTERN_BYTES = 4096

_STAR = None


class PatternTooLong(ValueError):
    """A pattern over :data:`MAX_PATTERN_BYTES`."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    #: The segments between the stars, each a regex of fixed ``length``.
    segments: tuple[re.Pattern[bytes], ...]
    lengths: tuple[int, ...]
    #: Bytes every match needs: the sum of the segments' lengths.
    fixed: int


def _tokens(pattern: bytes) -> list[bytes | None]:
    """The pattern's tokens: each a regex piece for one byte, or ``_STAR``."""
    tokens: list[bytes | None] = []
    p, plen = 0, len(pattern)
    while p < plen:  # every turn moves p on by at least one
        char = pattern[p]
        if char == 0x2A:  # '*'
            if not tokens or tokens[-1] is not _STAR:
                tokens.append(_STAR)
        elif char == 0x3F:  # '?'
            tokens.append(b".")
        elif char == 0x5B:  # '['
            p, piece = _class(pattern, p + 1)
            tokens.append(piece)
        else:
            if char == 0x5C and p + 1 < plen:  # '\\'
                p += 1
                char = pattern[p]
            tokens.append(re.escape(bytes([char])))
        p += 1
    return tokens


def _class(pattern: bytes, p: int) -> tuple[int, bytes]:
    """The ``[...]`` class starting at ``p`` (after its ``[``): where it
    ends (its ``]``, or the pattern's last byte) and its regex piece."""
    plen = len(pattern)
    negate = p < plen and pattern[p] == 0x5E
    if negate:
        p += 1
    members: list[bytes] = []
    while True:  # every turn moves p on, or breaks
        if p < plen and pattern[p] == 0x5C and p + 2 <= plen - 1:
            p += 1
            members.append(re.escape(bytes([pattern[p]])))
        elif p >= plen or pattern[p] == 0x5D:
            break
        elif p + 2 < plen and pattern[p + 1] == 0x2D:
            start, end = sorted((pattern[p], pattern[p + 2]))
            members.append(b"\\x%02x-\\x%02x" % (start, end))
            p += 2
        else:
            members.append(re.escape(bytes([pattern[p]])))
        p += 1
    if p >= plen:
        p -= 1  # an unterminated class ends at the pattern's end
    if not members:  # "[]" matches nothing, "[^]" anything
        return p, (b"." if negate else b"(?!)")
    return p, b"[" + (b"^" if negate else b"") + b"".join(members) + b"]"


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: bytes) -> _Compiled:
    """The compiled form of ``pattern`` (cached); :class:`PatternTooLong`."""
    if len(pattern) > MAX_PATTERN_BYTES:
        raise PatternTooLong(f"ERR pattern longer than {MAX_PATTERN_BYTES} bytes")
    tokens = _tokens(pattern)
    segments: list[list[bytes]] = [[]]
    for token in tokens:
        if token is _STAR:
            segments.append([])
        else:
            segments[-1].append(token)
    lengths = tuple(len(segment) for segment in segments)
    # (A pattern that starts or ends with a star has an empty first or last
    # segment, which matches there.)
    return _Compiled(
        tuple(re.compile(b"".join(segment), re.DOTALL) for segment in segments),
        lengths, sum(lengths))


def glob_match(pattern: bytes, subject: bytes, nocase: bool = False) -> bool:
    """Whether ``subject`` matches ``pattern`` as Redis's ``stringmatchlen``
    decides (``nocase``: both compared in lower case); linear in each, no
    backtracking (see the module docstring).  ``PatternTooLong`` past
    :data:`MAX_PATTERN_BYTES`."""
    if nocase:
        pattern, subject = pattern.lower(), subject.lower()
    compiled = compile_pattern(pattern)
    size = len(subject)
    if size < compiled.fixed:
        return False
    segments, lengths = compiled.segments, compiled.lengths
    if len(segments) == 1:  # no star
        return size == compiled.fixed and segments[0].fullmatch(subject) is not None
    # The first segment at the start, the last at the end (both have fixed
    # lengths, and the stars between them take any bytes).
    if segments[0].match(subject) is None:
        return False
    last = lengths[-1]
    if segments[-1].fullmatch(subject, size - last) is None:
        return False
    position, end = lengths[0], size - last
    for segment, length in zip(segments[1:-1], lengths[1:-1], strict=True):
        found = segment.search(subject, position, end)
        if found is None:
            return False
        position = found.start() + length
    return True
