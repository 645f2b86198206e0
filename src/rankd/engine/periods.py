"""Time windows and their periods, all aligned to UTC.

A board keeps one leaderboard per *window*.  A window is cut into *periods*
identified by readable ids; the timestamp of an event, not the time it is
processed, decides which period it lands in, so nothing is lost at a
boundary.

========  ===================  =============================================
window    period id            period
========  ===================  =============================================
all       ``all``              forever
daily     ``2026-11-22``       that UTC day
weekly    ``2026-W47``         that ISO 8601 week (Monday to Sunday, UTC)
monthly   ``2026-11``          that UTC calendar month
========  ===================  =============================================
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, date, datetime, timedelta

WINDOWS = ("all", "daily", "weekly", "monthly")

_DAILY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_WEEKLY = re.compile(r"^(\d{4})-W(\d{2})$")
_MONTHLY = re.compile(r"^(\d{4})-(\d{2})$")


def check_window(window: str) -> str:
    """Return ``window`` if it is a known window, else raise ``ValueError``."""
    if window not in WINDOWS:
        raise ValueError(f"unknown window {window!r}; windows are {', '.join(WINDOWS)}")
    return window


_DAY_SECONDS = 86400
_period_cache: dict[tuple[str, int], str] = {}


def period_of(window: str, ts: float) -> str:
    """The id of the period of ``window`` that contains ``ts`` (Unix seconds)."""
    if window == "all":
        return "all"
    # Every period is made of whole UTC days: cache by (window, day number),
    # since nearly every event falls on one of a handful of days.
    key = (window, int(ts // _DAY_SECONDS))
    period = _period_cache.get(key)
    if period is None:
        if len(_period_cache) > 4096:
            _period_cache.clear()
        period = _period_cache[key] = _period_of_day(window, ts)
    return period


def _period_of_day(window: str, ts: float) -> str:
    day = datetime.fromtimestamp(ts, UTC).date()
    if window == "daily":
        return day.isoformat()
    if window == "weekly":
        year, week, _ = day.isocalendar()
        return f"{year:04d}-W{week:02d}"
    if window == "monthly":
        return f"{day.year:04d}-{day.month:02d}"
    raise ValueError(f"unknown window {window!r}; windows are {', '.join(WINDOWS)}")


def period_start(window: str, period: str) -> date | None:
    """The first UTC day of a period (``None`` for ``all``).

    Raises ``ValueError`` for an id that is malformed or does not belong to
    ``window``.
    """
    check_window(window)
    if window == "all":
        if period != "all":
            raise ValueError(f"the 'all' window has the single period 'all', not {period!r}")
        return None
    pattern = {"daily": _DAILY, "weekly": _WEEKLY, "monthly": _MONTHLY}[window]
    match = pattern.match(period)
    if match is None:
        example = {"daily": "2026-11-22", "weekly": "2026-W47", "monthly": "2026-11"}[window]
        raise ValueError(f"bad {window} period id {period!r}, expected e.g. {example!r}")
    try:
        if window == "daily":
            return date(*map(int, match.groups()))
        if window == "weekly":
            return date.fromisocalendar(int(match[1]), int(match[2]), 1)
        return date(int(match[1]), int(match[2]), 1)
    except ValueError as exc:
        raise ValueError(f"bad {window} period id {period!r}: {exc}") from None


def period_bounds(window: str, period: str) -> tuple[float, float]:
    """``[start, end)`` of a period in Unix seconds (``-inf, inf`` for ``all``)."""
    start = period_start(window, period)
    if start is None:
        return float("-inf"), float("inf")
    if window == "daily":
        end = start + timedelta(days=1)
    elif window == "weekly":
        end = start + timedelta(weeks=1)
    else:
        end = date(start.year + start.month // 12, start.month % 12 + 1, 1)
    return _midnight(start), _midnight(end)


def _midnight(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def oldest_retained(window: str, now: float, retain: int) -> str:
    """The id of the oldest closed period still kept when ``retain`` are kept.

    Retention counts calendar periods, not the ones that saw events: with
    ``retain=8`` a daily board keeps the last eight days, however sparse.
    Computed by calendar arithmetic (once per window, current period and
    ``retain``, cached), not by walking back period by period: housekeeping
    asks for every board and window.
    """
    return _oldest_retained(window, period_of(window, now), retain)


@functools.lru_cache(maxsize=1024)
def _oldest_retained(window: str, current: str, retain: int) -> str:
    start = period_start(window, current)
    if start is None:
        return "all"
    if window == "daily":
        oldest = start - timedelta(days=retain)
    elif window == "weekly":
        oldest = start - timedelta(weeks=retain)
    else:
        months = start.year * 12 + start.month - 1 - retain
        oldest = date(months // 12, months % 12 + 1, 1)
    return period_of(window, _midnight(oldest))
