"""``INFO``'s sections as Redis 7.2 lays them out: their titles (``# CPU``),
which ``INFO`` alone, ``default``, ``all`` and ``everything`` show, in
Redis's order, and the sections made of counts: ``commandstats`` (per
command) and ``errorstats`` (per error code, counted as errors are
written), and a master's ``replication`` section.

What ``usec`` would time is not measured (0), and commands answered on
the native fast path (plain ``ZADD``/``ZINCRBY``, ``ZSCORE``, ``ZRANK``,
``ZREVRANK``, ``ZRANGE``, ``ZREVRANGE``) are counted together, as
``rankd_native_writes``/``rankd_native_reads`` in ``# Stats``, not per
command (a per-command count there would cost the hot path).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping

#: Every section, in Redis's order, and its title.
TITLES = {"server": "Server", "clients": "Clients", "memory": "Memory",
          "persistence": "Persistence", "stats": "Stats", "replication": "Replication",
          "cpu": "CPU", "modules": "Modules", "commandstats": "Commandstats",
          "errorstats": "Errorstats", "latencystats": "Latencystats", "cluster": "Cluster",
          "keyspace": "Keyspace"}
#: What ``INFO`` and ``INFO default`` show (``all`` adds the rest).
DEFAULT = frozenset(TITLES) - {"commandstats", "latencystats"}

#: Error replies written, by code (their first word: ``ERR``, ``NOPERM``...).
ERRORS: Counter[str] = Counter()
#: The most codes kept: a code is the first word of rankd's own errors, never
#: a client's text, but a bound costs nothing.
MAX_CODES = 128
#: This process's replication id (a master's, which no replica follows).
REPLICATION_ID = os.urandom(20).hex()


def count_error(text: str) -> None:
    """Count an error reply whose text is ``text``."""
    code = text.split(" ", 1)[0]
    if code in ERRORS or len(ERRORS) < MAX_CODES:
        ERRORS[code] += 1


def wanted(words: Iterable[bytes]) -> list[str]:
    """The sections ``INFO words...`` shows, in Redis's order."""
    asked = {word.lower().decode(errors="replace") for word in words}
    if not asked or "default" in asked:
        asked |= DEFAULT
    if asked & {"all", "everything"}:
        asked |= set(TITLES)
    return [name for name in TITLES if name in asked]


def render(sections: Mapping[str, list[tuple[str, object]]], names: list[str]) -> str:
    """The text of ``names``' sections (a section without fields: its title)."""
    lines = []
    for name in names:
        lines.append(f"# {TITLES[name]}")
        lines += [f"{key}:{value}" for key, value in sections.get(name, [])]
        lines.append("")
    return "\r\n".join(lines).rstrip("\r\n") + "\r\n"


def commandstats(counts: Mapping[tuple[str, str], int]) -> list[tuple[str, object]]:
    """``cmdstat_<name>`` of each command the server answered: calls (its
    failures included), failed_calls; ``usec`` is not measured."""
    calls: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for (name, outcome), count in counts.items():
        if name in ("unknown", "read", "write", "submit") or not count:
            continue  # not a command: the native lanes' totals, unknown names
        calls[name] += count
        if outcome != "ok":
            failed[name] += count
    return [(f"cmdstat_{name}", f"calls={calls[name]},usec=0,usec_per_call=0.00,"
             f"rejected_calls=0,failed_calls={failed[name]}") for name in sorted(calls)]


def errorstats() -> list[tuple[str, object]]:
    return [(f"errorstat_{code}", f"count={count}") for code, count in sorted(ERRORS.items())]


def replication() -> list[tuple[str, object]]:
    """A master's section, no replica (rankd's replication is its own)."""
    return [("role", "master"), ("connected_slaves", 0),
            ("master_failover_state", "no-failover"), ("master_replid", REPLICATION_ID),
            ("master_replid2", "0" * 40), ("master_repl_offset", 0),
            ("second_repl_offset", -1), ("repl_backlog_active", 0),
            ("repl_backlog_size", 1048576), ("repl_backlog_first_byte_offset", 0),
            ("repl_backlog_histlen", 0)]
