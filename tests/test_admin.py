"""The operator commands of the rankd CLI against a real daemon and data dir."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random

from daemon import Daemon
from rankd.cli import main
from rankd.engine.wal import HEADER_BYTES, WriteAheadLog


def test_import_export_top_snapshot_and_wal_inspect(tmp_path, capsys):
    data_dir = tmp_path / "data"
    rng = random.Random(5)
    rows = [{"member": f"p{i}", "score": rng.randint(0, 10_000), "label": f"Player {i}"}
            for i in range(2500)]
    source = tmp_path / "scores.csv"
    with open(source, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["member", "score", "label"])
        writer.writeheader()
        writer.writerows(rows)
        handle.write("bad,notanumber,\n")
    with Daemon(data_dir) as daemon:
        daemon.request("PUT", "/v1/boards/imp", {"policy": "best"})
        url = ["--url", daemon.url]
        assert main(["import", str(source), "--board", "imp", *url]) == 1  # one bad line
        captured = capsys.readouterr()
        assert "not a number" in captured.err
        source.write_text(source.read_text().replace("bad,notanumber,\n", ""))
        assert main(["import", str(source), "--board", "imp", *url]) == 0
        assert "imported 2500 of 2500 events" in capsys.readouterr().err

        out_csv = tmp_path / "out.csv"
        assert main(["export", "imp", "--output", str(out_csv), *url]) == 0
        exported = list(csv.DictReader(io.StringIO(out_csv.read_text())))
        assert len(exported) == 2500
        best = sorted(rows, key=lambda r: -r["score"])
        assert [float(r["score"]) for r in exported] == [float(r["score"]) for r in best]
        assert [int(r["rank"]) for r in exported] == list(range(1, 2501))

        assert main(["export", "imp", "--format", "jsonl", *url]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2500 and json.loads(lines[0])["rank"] == 1

        jsonl = tmp_path / "more.jsonl"
        jsonl.write_text("\n".join(json.dumps({"member": f"q{i}", "score": 20_000 + i})
                                   for i in range(3)) + "\n")
        assert main(["import", str(jsonl), "--board", "imp", *url]) == 0
        capsys.readouterr()
        assert main(["top", "imp", "--limit", "3", *url]) == 0
        table = capsys.readouterr().out
        assert "imp · all all · 2,503 members" in table
        assert table.splitlines()[3].split() == ["1", "q2", "20,002"]

        assert main(["snapshot", *url]) == 0
        assert "snapshot at position" in capsys.readouterr().out
        assert main(["top", "nope", *url]) == 1
        assert "404" in capsys.readouterr().err

    assert main(["wal", "inspect", str(data_dir)]) == 0
    report = capsys.readouterr().out
    assert " ok" in report and "CORRUPT" not in report


def test_wal_inspect_reports_corruption_and_torn_tails(tmp_path, capsys):
    log = WriteAheadLog(tmp_path / "wal", fsync="no", segment_bytes=4096)
    for i in range(300):
        log.append(f"record {i}".encode() * 5)
    asyncio.run(log.close())
    segments = sorted((tmp_path / "wal").glob("*.log"))
    assert main(["wal", "inspect", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count(" ok") == len(segments)
    data = bytearray(segments[1].read_bytes())
    data[HEADER_BYTES + 1] ^= 0xFF
    segments[1].write_bytes(bytes(data))
    with open(segments[-1], "ab") as handle:
        handle.write(b"\x01\x02\x03")
    assert main(["wal", "inspect", str(tmp_path)]) == 1
    report = capsys.readouterr().out
    assert f"{segments[1].name}" in report and "CORRUPT at byte offset 0" in report
    assert "torn tail" in report


def test_admin_commands_report_unreachable_daemons(capsys):
    assert main(["top", "b", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach rankd" in capsys.readouterr().err
    assert main(["wal", "inspect", "/nonexistent"]) == 1


def test_csv_reader_converts_numbers_and_skips_empty_cells():
    from rankd.admin import read_events

    source = io.StringIO("member,delta,event_id,label\nann,2.5,e1,\nbob,1,,Bob\n")
    assert list(read_events(source, "csv")) == [
        {"member": "ann", "delta": 2.5, "event_id": "e1"},
        {"member": "bob", "delta": 1.0, "label": "Bob"}]


def test_cli_rough_edges(tmp_path, capsys):
    """A missing board once printed one line per row and counted duplicates
    as imported; export wrote a header before failing and broke on a closed
    pipe; progress bars went into logs; the Server header named versions."""
    import subprocess
    import sys
    import urllib.request

    from daemon import SRC

    source = tmp_path / "scores.jsonl"
    source.write_text("".join(json.dumps({"member": f"m{i}", "delta": 1,
                                          "event_id": f"e{i}"}) + "\n" for i in range(3000)))
    with Daemon(tmp_path / "data") as daemon:
        url = ["--url", daemon.url]
        assert main(["import", str(source), "--board", "missing", *url]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "404" in err, err
        daemon.request("PUT", "/v1/boards/b", {"policy": "sum"})
        assert main(["import", str(source), "--board", "b", *url]) == 0
        assert "imported 3000 of 3000 events (0 already there" in capsys.readouterr().err
        assert main(["import", str(source), "--board", "b", *url]) == 0
        err = capsys.readouterr().err
        assert "imported 0 of 3000 events (3000 already there, 0 rejected)" in err
        assert "it/s" not in err and "event/s" not in err  # no progress bar off a terminal

        out = tmp_path / "missing.csv"
        assert main(["export", "missing", "--output", str(out), *url]) == 1
        assert out.read_text() == ""  # no header for a board that is not there
        capsys.readouterr()

        env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            f"{sys.executable} -m rankd.cli export b --format jsonl --url {daemon.url} "
            "| head -n 2", shell=True, env=env, capture_output=True, text=True, timeout=60)
        assert len(done.stdout.splitlines()) == 2 and "Traceback" not in done.stderr

        with urllib.request.urlopen(daemon.url + "/v1/health", timeout=10) as response:
            assert response.headers["Server"] == "rankd"
