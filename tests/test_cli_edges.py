"""The operator CLI's rough edges a newcomer meets: ``rankd top``'s numbers
and columns, where ``--url`` may go and what it may omit, and credentials
never following a redirect to another origin."""

from __future__ import annotations

import http.server
import json
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from daemon import Daemon
from rankd.cli import main


def _display_width(text: str) -> int:
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def test_top_prints_exact_grouped_numbers_in_aligned_columns(tmp_path, capsys):
    """1234567 once printed as 1.23457e+06, 3e9 as 3e+09, and a wide label
    pushed its score out of the column."""
    with Daemon(tmp_path / "data") as daemon:
        daemon.request("PUT", "/v1/boards/big", {"policy": "best"})
        status, _ = daemon.request("POST", "/v1/boards/big/scores/batch", {"events": [
            {"member": "a", "score": 3_000_000_000, "label": "王小明"},
            {"member": "b", "score": 1_234_567, "label": "Zoe\u0308"},
            {"member": "c", "score": 12.5},
            {"member": "d", "score": 1_234_567.25, "label": "ｆｕｌｌ"},
        ]})
        assert status == 200
        assert main(["top", "big", "--url", daemon.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = lines[3:]
    assert [row.split()[-1] for row in rows] == ["3,000,000,000", "1,234,567.25",
                                                 "1,234,567", "12.5"]
    assert "王小明" in rows[0] and "ｆｕｌｌ" in rows[1]
    widths = {_display_width(line) for line in lines[1:]}
    assert len(widths) == 1, lines  # every row ends where the header ends
    labels = ["王小明", "ｆｕｌｌ", "Zoe\u0308", "c"]
    member_column = {_display_width(line[:line.index(name)])
                     for line, name in zip(rows, labels, strict=True)}
    assert len(member_column) == 1, lines


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers each path with its entry of ``replies`` (status, headers,
    body; the ``None`` entry for any other path) and records the
    Authorization header each request carried."""

    seen: list[str | None]
    replies: dict[str | None, tuple[int, dict[str, str], bytes]]

    def _answer(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        status, headers, body = self.replies.get(self.path) or self.replies[None]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


STATUS = json.dumps({"nodes": [{"node": "n1", "advertise": "http://127.0.0.1:1",
                                "alive": True, "silent_seconds": 0}],
                     "groups": []}).encode()


@contextmanager
def _server(replies: dict[str | None, tuple[int, dict[str, str], bytes]]
            ) -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "replies": replies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_token_never_follows_a_redirect_to_another_origin(capsys):
    """The admin CLI followed a redirect to another host with the admin
    token.  The second server (another port: another origin) must not see
    it; the command fails naming where it was sent."""
    with _server({None: (200, {}, STATUS)}) as (second, second_seen), \
            _server({None: (302, {"Location": second + "/v1/cluster"}, b"")}) as (first,
                                                                                  first_seen):
        code = main(["cluster", "status", "--url", first, "--token", "s3cret-admin"])
        err = capsys.readouterr().err
    assert first_seen == ["Bearer s3cret-admin"]
    assert "Bearer s3cret-admin" not in second_seen, second_seen
    assert code == 1 and "redirect" in err and second in err, err


def test_a_same_origin_redirect_keeps_the_token(capsys):
    with _server({"/v1/cluster": (302, {"Location": "/v1/cluster-moved"}, b""),
                  None: (200, {}, STATUS)}) as (url, seen):
        assert main(["cluster", "status", "--url", url, "--token", "s3cret-admin"]) == 0
    assert seen == ["Bearer s3cret-admin", "Bearer s3cret-admin"]
    assert "node n1" in capsys.readouterr().out


def test_cluster_status_takes_url_after_the_action_and_without_a_scheme(tmp_path, capsys):
    """``rankd cluster status --url URL`` was refused (the option only
    worked before the action), and ``127.0.0.1:PORT`` failed for want of
    ``http://``."""
    with _server({None: (200, {}, STATUS)}) as (url, _):
        bare = url.removeprefix("http://")
        assert main(["cluster", "status", "--url", url]) == 0
        assert "node n1" in capsys.readouterr().out
        assert main(["cluster", "--url", bare, "status"]) == 0
        assert "node n1" in capsys.readouterr().out
        assert main(["cluster", "status", "--url", bare]) == 0
        assert "node n1" in capsys.readouterr().out
    with Daemon(tmp_path / "data") as daemon:
        assert main(["snapshot", "--url", daemon.url.removeprefix("http://")]) == 0
        capsys.readouterr()
    for bad in ("ftp://127.0.0.1:9", "127.0.0.1:port"):
        with pytest.raises(SystemExit) as refused:
            main(["top", "b", "--url", bad])
        assert refused.value.code == 2
        assert "--url" in capsys.readouterr().err
