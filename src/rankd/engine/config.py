"""Board configuration: how a leaderboard orders, scores and windows."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

from rankd.engine.errors import InvalidInput
from rankd.engine.periods import WINDOWS
from rankd.index._contract import TIE_BREAKS

POLICIES = ("best", "sum", "latest")
MAX_LABEL_CHARS = 64
MAX_EVENT_ID_BYTES = 128
MAX_RETAIN = 1000
#: The longest board name (a Redis key), in bytes of UTF-8.
MAX_BOARD_NAME_BYTES = 512

#: Characters no board name, member, label or event id may hold: C0 and C1
#: controls and DEL (a NUL once stopped Postgres shipping for good), the
#: line and paragraph separators, bidi embeddings, overrides and isolates
#: (they reorder how a page shows the names around them), and the invisible
#: zero-width space, word joiner, invisible operators and BOM (two names
#: that look the same).  Zero-width joiners and directional marks stay:
#: emoji sequences and several scripts need them.
REFUSED_CHARACTERS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")

BOARD_NAME_RULE = (f"1 to {MAX_BOARD_NAME_BYTES} bytes of UTF-8 text without control or "
                   "invisible formatting characters, not . or ..")


def is_board_name(name: str) -> bool:
    """Whether ``name`` may name a board: any text Redis users write as a
    key (``{tag}:daily``, ``/``, spaces, accents...) of 1 to
    :data:`MAX_BOARD_NAME_BYTES` bytes, but not ``.`` nor ``..`` (a REST
    path cannot carry them: URL normalisation removes such segments) and
    without :data:`REFUSED_CHARACTERS`.  Names never become file names."""
    if name.isascii():
        # isprintable: no C0 control nor DEL, the only refused ASCII.
        return (0 < len(name) <= MAX_BOARD_NAME_BYTES and name.isprintable()
                and name not in (".", ".."))
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False  # a lone surrogate: no UTF-8 text
    return size <= MAX_BOARD_NAME_BYTES and REFUSED_CHARACTERS.search(name) is None


def check_board_name(name: object) -> str:
    """Return ``name`` if it is a valid board name, else raise InvalidInput."""
    if not isinstance(name, str) or not is_board_name(name):
        raise InvalidInput(f"board name must be {BOARD_NAME_RULE}, got {name!r}")
    return name


def file_name_of(name: str) -> str:
    """The file name standing for board ``name`` (the archive's directory):
    a name percent-encoded but for letters, digits and ``_ . : -`` (so the
    names of before keep their directories, and ``/``, ``..`` or a NUL
    never reach a path), or, past 200 bytes (file names end at 255),
    ``~`` and the SHA-256 of its UTF-8 (``~`` is always encoded otherwise)."""
    encoded = quote(name, safe=":").replace("~", "%7E")
    if name in (".", "..") or len(encoded) > 200:
        return "~" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return encoded


@dataclass(frozen=True)
class BoardConfig:
    """A board's configuration.

    ``policy`` says how a submission changes a member's score: ``best``
    keeps the best score ever submitted (under ``order``), ``sum`` adds a
    delta, ``latest`` replaces.  ``windows`` are the time windows kept (see
    :mod:`rankd.engine.periods`); ``retain`` closed periods of each stay
    queryable.  ``min_score``/``max_score`` bound every resulting score and
    ``max_delta`` bounds how much one submission may change a score.
    ``tie_break`` orders equal scores: ``first`` who got there first,
    ``member`` by member A to Z, ``member_desc`` Z to A (on a ``desc``
    board, the order of Redis's ``ZREVRANGE``: what RESP makes boards with).
    """

    order: str = "desc"
    policy: str = "best"
    tie_break: str = "first"
    windows: tuple[str, ...] = ("all",)
    retain: int = 8
    min_score: float | None = None
    max_score: float | None = None
    max_delta: float | None = None
    #: Submissions must carry an HMAC signature (see rankd.security.signing).
    signed: bool = False
    #: On a cluster, ``"all"``: the board's group is kept on every live node
    #: (a follower on each, so its live feed is local everywhere); None: the
    #: cluster's ``--replicas``.  Shown only when set.
    replicas: str | None = None

    @classmethod
    def from_dict(cls, data: object) -> BoardConfig:
        """Validate a config given as JSON-like data; unknown fields are refused."""
        if not isinstance(data, dict):
            raise InvalidInput("board config must be an object")
        known = {"order", "policy", "tie_break", "windows", "retain",
                 "min_score", "max_score", "max_delta", "signed", "replicas"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"unknown board config field(s): {', '.join(map(str, unknown))}")
        values: dict[str, Any] = {}
        values["order"] = _choice(data, "order", ("desc", "asc"), "desc")
        values["policy"] = _choice(data, "policy", POLICIES, "best")
        values["tie_break"] = _choice(data, "tie_break", TIE_BREAKS, "first")
        windows = data.get("windows", ["all"])
        if (not isinstance(windows, list | tuple) or not windows
                or not all(isinstance(w, str) for w in windows)):
            raise InvalidInput("windows must be a non-empty list of window names")
        for window in windows:
            if window not in WINDOWS:
                raise InvalidInput(f"unknown window {window!r}; windows are {', '.join(WINDOWS)}")
        if len(set(windows)) != len(windows):
            raise InvalidInput("windows must not repeat")
        values["windows"] = tuple(windows)
        retain = data.get("retain", 8)
        if isinstance(retain, float) and retain.is_integer():
            retain = int(retain)  # JSON's 110.0 is the integer 110 (as JSON Schema says)
        if isinstance(retain, bool) or not isinstance(retain, int) or not 0 <= retain <= MAX_RETAIN:
            raise InvalidInput(f"retain must be an integer from 0 to {MAX_RETAIN}")
        values["retain"] = retain
        for name in ("min_score", "max_score", "max_delta"):
            value = data.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidInput(f"{name} must be a number or null")
                if not math.isfinite(value):
                    raise InvalidInput(f"{name} must be finite")
                value = float(value)
            values[name] = value
        if values["max_delta"] is not None and values["max_delta"] <= 0:
            raise InvalidInput("max_delta must be positive")
        if (values["min_score"] is not None and values["max_score"] is not None
                and values["min_score"] > values["max_score"]):
            raise InvalidInput("min_score must not exceed max_score")
        signed = data.get("signed", False)
        if not isinstance(signed, bool):
            raise InvalidInput("signed must be true or false")
        values["signed"] = signed
        replicas = data.get("replicas")
        if replicas not in (None, "all"):
            raise InvalidInput(f'replicas must be "all" or null (the cluster\'s --replicas); '
                               f"got {replicas!r}")
        values["replicas"] = replicas
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-like data (inverse of :meth:`from_dict`)."""
        data = asdict(self)
        data["windows"] = list(self.windows)
        if self.replicas is None:
            # Left out unset: configs (and digests) of boards without it stay as before.
            del data["replicas"]
        return data

    @property
    def primary_window(self) -> str:
        """The window reads use by default: ``all`` if kept, else the first."""
        return "all" if "all" in self.windows else self.windows[0]


def _choice(data: dict, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = data.get(name, default)
    if value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value
