"""Operator commands of the ``rankd`` CLI.

``wal inspect`` reads a data dir offline (read-only: it never truncates or
repairs).  The others talk to a running daemon over its REST API
(``--url``, default ``http://127.0.0.1:7700``; ``--token`` or
``RANKD_TOKEN`` for servers with credentials), so they go through the same
checks as any client.  Long operations show a progress bar (tqdm) with rate
and ETA on stderr.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from rankd.engine.wal import HEADER_BYTES, inspect_log
from rankd.terminal import display_width, exact_number, pad, printable

DEFAULT_URL = "http://127.0.0.1:7700"
PAGE = 1000
BATCH = 1000


class AdminError(Exception):
    """A command failed; the message says why."""


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def daemon_url(url: str) -> str:
    """``url`` as the admin commands use it: ``http://`` when it names no
    scheme (``127.0.0.1:7700``), no trailing slash.  Anything else than an
    http(s) address raises ``ValueError``."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"--url {url!r}: the port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    return url.rstrip("/")


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the origin it started at: the admin
    token (an ``Authorization`` header) must never reach another host, port
    or scheme, which could be anyone's."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        if _origin(newurl) != _origin(req.full_url):
            raise AdminError(f"{req.get_method()} {req.full_url} redirects ({code}) to "
                             f"{newurl}, another origin: not followed, so the token is not "
                             "sent there (give that address as --url if it is rankd)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class Api:
    """A tiny blocking REST client for the admin commands."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None) -> None:
        self.url = daemon_url(url)
        self.token = token if token is not None else os.environ.get("RANKD_TOKEN")
        self._opener = urllib.request.build_opener(_SameOriginRedirects)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers)
        try:
            with self._opener.open(request, timeout=60) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            try:
                detail = json.loads(error.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = error.reason
            raise AdminError(f"{method} {path}: {error.code} {detail}") from None
        except OSError as error:
            raise AdminError(f"cannot reach rankd at {self.url}: {error}") from None
        return json.loads(payload) if payload else None


def _view_query(window: str | None, period: str | None, **extra: Any) -> str:
    params = {name: value for name, value in
              {"window": window, "period": period, **extra}.items() if value is not None}
    return "?" + urllib.parse.urlencode(params) if params else ""


# --- wal inspect -------------------------------------------------------------------------


def wal_inspect(data_dir: Path, out: TextIO | None = None) -> int:
    """Print each segment's records, positions and checksum status; 1 if any is damaged."""
    out = out or sys.stdout
    wal_dir = Path(data_dir) / "wal"
    reports = inspect_log(wal_dir)
    if not reports:
        raise AdminError(f"no WAL segments in {wal_dir}")
    damaged = 0
    out.write(f"{'segment':<26} {'records':>9} {'first':>12} {'last':>12} {'bytes':>12}  status\n")
    for path, report in reports:
        first = report["first_lsn"] if report["records"] else "-"
        last = report["last_lsn"] if report["records"] else "-"
        out.write(f"{path.name:<26} {report['records']:>9} {first!s:>12} {last!s:>12} "
                  f"{report['bytes']:>12}  {report['status']}\n")
        damaged += report["status"] != "ok"
    for aside in sorted(wal_dir.glob("corrupt-*")):
        out.write(f"set aside by a repair: {aside.name} ({aside.stat().st_size} bytes)\n")
    out.write(f"record header: {HEADER_BYTES} bytes (CRC-32, length, position)\n")
    return 1 if damaged else 0


# --- standings out and in ----------------------------------------------------------------


def showing_progress() -> bool:
    """Progress bars only for a person watching: not into a log or a pipe."""
    return sys.stderr.isatty()


def iterate_standings(api: Api, board: str, window: str | None, period: str | None,
                      progress: bool = True) -> Iterator[dict[str, Any]]:
    path = f"/v1/boards/{urllib.parse.quote(board, safe='')}/top"
    first = api.call("GET", path + _view_query(window, period, limit=1))
    total = first["total"]
    with tqdm(total=total, unit="member", disable=not (progress and showing_progress()),
              file=sys.stderr) as bar:
        offset = 0
        while offset < total:
            page = api.call("GET", path + _view_query(window, period, limit=PAGE,
                                                      offset=offset))
            if not page["entries"]:
                break
            yield from page["entries"]
            offset += len(page["entries"])
            bar.update(len(page["entries"]))


def export(api: Api, board: str, window: str | None, period: str | None, fmt: str,
           out: TextIO | None = None, progress: bool = True) -> int:
    """Write a window's standings as CSV or JSONL; returns how many.  Nothing
    is written (not even the CSV header) unless the board answers."""
    out = out or sys.stdout
    count = 0
    writer = None
    entries = iterate_standings(api, board, window, period, progress)
    first = next(entries, None)  # fails here, before any output, for a missing board
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(["rank", "member", "score", "label"])
    for entry in itertools.chain([] if first is None else [first], entries):
        if writer is not None:
            writer.writerow([entry["rank"], entry["member"], repr(entry["score"]),
                             entry["label"] or ""])
        else:
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        count += 1
    return count


def read_events(source: TextIO, fmt: str) -> Iterator[dict[str, Any]]:
    """Submissions from CSV (header: member, score|delta, [event_id], [label]) or JSONL."""
    if fmt == "jsonl":
        for number, line in enumerate(source, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise AdminError(f"line {number}: not JSON ({exc})") from None
        return
    for number, row in enumerate(csv.DictReader(source), 2):
        event: dict[str, Any] = {}
        for name, value in row.items():
            if value in (None, "") or name in ("rank",):
                continue
            if name in ("score", "delta", "ts"):
                try:
                    event[name] = float(value)
                except ValueError:
                    raise AdminError(f"line {number}: {name} {value!r} is not a number") \
                        from None
            else:
                event[name] = value
        yield event


@dataclass
class Imported:
    """What an import did: applied, already there (duplicate event ids), refused."""

    applied: int = 0
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)


def import_events(api: Api, board: str, events: Iterator[dict[str, Any]], total: int | None,
                  progress: bool = True) -> Imported:
    """Submit events in batches.  A board that does not exist fails at once
    (``AdminError``), before any event is sent."""
    quoted = urllib.parse.quote(board, safe="")
    api.call("GET", f"/v1/boards/{quoted}")
    path = f"/v1/boards/{quoted}/scores/batch"
    done = Imported()
    batch: list[dict[str, Any]] = []
    with tqdm(total=total, unit="event", disable=not (progress and showing_progress()),
              file=sys.stderr) as bar:
        def flush() -> None:
            results = api.call("POST", path, {"events": batch})["results"]
            for event, result in zip(batch, results, strict=True):
                if "error" in result:
                    done.errors.append(f"{event.get('member')!r}: "
                                       f"{result['error']['message']}")
                elif result["duplicate"]:
                    done.duplicates += 1
                else:
                    done.applied += 1
            bar.update(len(batch))
            batch.clear()

        for event in events:
            batch.append(event)
            if len(batch) == BATCH:
                flush()
        if batch:
            flush()
    return done


def top_table(api: Api, board: str, window: str | None, period: str | None, limit: int,
              out: TextIO | None = None) -> None:
    """A leaderboard as a table in the terminal."""
    out = out or sys.stdout
    path = f"/v1/boards/{urllib.parse.quote(board, safe='')}/top"
    page = api.call("GET", path + _view_query(window, period, limit=limit))
    rows = [(exact_number(e["rank"]), printable(e["label"] or e["member"]),
             exact_number(e["score"])) for e in page["entries"]]
    header = ("#", "member", "score")
    widths = [max([display_width(h), *(display_width(r[i]) for r in rows)])
              for i, h in enumerate(header)]
    out.write(f"{printable(board)} · {page['window']} {page['period']} · "
              f"{exact_number(page['total'])} members\n")
    for rank, member, score in [header, tuple("-" * w for w in widths), *rows]:
        out.write(f"{pad(rank, widths[0], right=True)}  {pad(member, widths[1])}  "
                  f"{pad(score, widths[2], right=True)}\n")


def orphaned_events(path: Path) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The submissions in a node's ``wal/orphan-*`` file, by board, as the
    API takes them (same event ids, values and times), and a description of
    every other record in it (board changes, removals: not resubmitted)."""
    from rankd.engine import records
    from rankd.engine.frames import HEADER, scan

    data = path.read_bytes()
    if len(data) < HEADER.size:
        return {}, []
    first = HEADER.unpack_from(data)[2]
    found = scan(data, first)
    if found.bad is not None:
        raise AdminError(f"{path} is damaged at byte {found.bad.offset}")
    events: dict[str, list[dict[str, Any]]] = {}
    others = []
    for seq, payload in found.records:
        record = records.decode(payload)
        if record[0] != records.SUBMIT:
            others.append(f"position {seq}: {records.KIND_NAMES.get(record[0], record[0])} "
                          f"of board {record[1]!r}")
            continue
        _, board, member, value, is_delta, event_id, ts_ms, _, label = record[:9]
        event: dict[str, Any] = {"member": member, "delta" if is_delta else "score": value,
                                 "ts": ts_ms / 1000}
        if event_id is not None:
            event["event_id"] = event_id
        if label is not None:
            event["label"] = label
        events.setdefault(board, []).append(event)
    return events, others


def resubmit_orphans(api: Api, path: Path, *, without_event_id: bool = False,
                     out: TextIO | None = None) -> int:
    """Submit a node's set-aside records again through the API; events with
    an event id are safe to resubmit (one that did commit answers as a
    duplicate), those without are skipped unless ``without_event_id``.
    Returns the number of events refused."""
    out = out or sys.stderr
    events, others = orphaned_events(path)
    refused = 0
    for board, board_events in events.items():
        keyless = [e for e in board_events if "event_id" not in e]
        if keyless and not without_event_id:
            print(f"{board}: {len(keyless)} events without an event id skipped (resubmitting "
                  "one that did commit would apply it twice; --without-event-id sends them)",
                  file=out)
            board_events = [e for e in board_events if "event_id" in e]
        if not board_events:
            continue
        done = import_events(api, board, iter(board_events), len(board_events))
        refused += len(done.errors)
        print(f"{board}: {done.applied} applied, {done.duplicates} already there, "
              f"{len(done.errors)} refused", file=out)
        for error in done.errors[:20]:
            print(f"  refused {error}", file=out)
    for other in others:
        print(f"not resubmitted: {other}", file=out)
    return refused


def move_group(api: Api, group: int, node: str, wait: float = 0.0) -> int:
    """``rankd cluster move``: ask for ``group`` to move to ``node``; with
    ``wait``, poll the cluster's status until ``node`` writes it (exit 0) or
    the time is up (exit 1)."""
    answer = api.call("POST", "/v1/cluster/moves", {"group": group, "node": node})
    print(f"group {group} is to move to node {node} (topology epoch "
          f"{answer['topology_epoch']})")
    deadline = time.monotonic() + wait
    while wait > 0:
        status = api.call("GET", "/v1/cluster")
        primary = next((g["primary"] for g in status["groups"] if g["group"] == group), None)
        moving = any(m["group"] == group for m in status.get("placement", {}).get("moves", []))
        if primary == node and not moving:
            print(f"node {node} writes group {group}")
            return 0
        if time.monotonic() > deadline:
            print(f"node {node} does not write group {group} yet (the move goes on)",
                  file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 0
