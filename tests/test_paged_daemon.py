"""The daemon on the compact paged index (``--index pages``, rankd._pages).

What this file proves: the setting is checked; every board of an engine
set to ``pages`` is a paged index, served by every front-end (the native
lanes through ``rankd/_pages.pxd``: ``test_paged_lanes.py``) with the
answers the skip list gives; a data dir written under one layout starts under the
other (the paged index dumps boards tied by member as version 2, without
seqs), in both directions, through real restarts; and a kill -9 under
REST, TCP and RESP load loses nothing acknowledged.

The paged index is the default.  Every daemon the test harness starts
takes ``RANKD_INDEX`` from the environment like any ``RANKD_*`` setting, and
``engine_helpers.engine_config`` reads it too, so whole suites run on the
skip list with, e.g. (as ``.ci/run`` does for the suites of the native
lanes)::

    RANKD_INDEX=skiplist pytest tests/test_resp_differential.py tests/test_rest.py
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import test_ingest as ingest_cases
from conftest import native_required
from crash_load import kill_under_load, submit_over_rest, submit_over_tcp
from daemon import SRC, Daemon
from engine_helpers import FakeClock, run, sub, with_engine
from rankd.cli import build_parser
from rankd.client import Client
from rankd.config import ConfigError, resolve
from rankd.engine.engine import EngineConfig
from rankd.index import kinds
from respclient import RawClient

pytestmark = pytest.mark.skipif(
    not native_required() and kinds.index_class("pages") is kinds.index_class("skiplist"),
    reason="the native indexes are not built")

#: Boards of every tie-break and order: a board tied by member is the one
#: whose dump versions differ between the layouts.
BOARDS = {
    "first": {"policy": "sum"},
    "member": {"policy": "best", "tie_break": "member"},
    "member_desc": {"policy": "latest", "tie_break": "member_desc", "order": "asc"},
    "windows": {"policy": "sum", "windows": ["all", "daily", "weekly", "monthly"]},
}


def test_the_index_setting_is_checked_and_named_where_it_came_from():
    parse = build_parser().parse_args
    assert resolve(parse(["serve"]), {}).index == "pages"  # the compact layout by default
    assert resolve(parse(["serve", "--index", "skiplist"]), {}).index == "skiplist"
    assert resolve(parse(["serve", "--index", "pages"]), {}).index == "pages"
    assert resolve(parse(["serve"]), {"RANKD_INDEX": "pages"}).index == "pages"
    with pytest.raises(ConfigError, match="RANKD_INDEX: must be one of"):
        resolve(parse(["serve"]), {"RANKD_INDEX": "btree"})
    with pytest.raises(ValueError, match="index must be one of pages, skiplist"):
        EngineConfig(index="btree")
    result = subprocess.run([sys.executable, "-m", "rankd.cli", "serve", "--help"],
                            capture_output=True, text=True, env={"PYTHONPATH": str(SRC)})
    assert "--index" in result.stdout and "RANKD_INDEX" in result.stdout


@pytest.mark.parametrize("kind", ["skiplist", "pages"])
def test_every_board_of_an_engine_is_built_with_its_index_kind(tmp_path, kind):
    expected = kinds.index_class(kind)

    async def body(engine):
        for name, config in BOARDS.items():
            await engine.put_board(name, config)
            for i in range(30):
                await engine.submit(sub(name, f"p{i}", **(
                    {"delta": i % 4} if config["policy"] == "sum" else {"score": i % 5})))
        await engine.snapshot()
        return {(name, window): type(index) for name, board in engine.boards.items()
                for window, periods in board.periods.items() for index in periods.values()}

    built = run(with_engine(tmp_path / "data", FakeClock(), body, index=kind))
    assert len(built) == 7 and set(built.values()) == {expected}
    # Loaded from the snapshot: the same kind again.
    loaded = run(with_engine(tmp_path / "data", FakeClock(), body, index=kind))
    assert set(loaded.values()) == {expected}


def _fill(daemon: Daemon, seed: int) -> None:
    """Boards of every kind, written through REST, TCP and RESP."""
    rng = random.Random(seed)
    for name, config in BOARDS.items():
        status, _ = daemon.request("PUT", f"/v1/boards/{name}", config)
        assert status in (200, 201)
    with Client("127.0.0.1", daemon.tcp_port) as client, \
            RawClient(daemon.resp_port) as resp:
        for i in range(300):
            name = rng.choice(list(BOARDS))
            field = "delta" if BOARDS[name]["policy"] == "sum" else "score"
            event = {"member": f"m{rng.randrange(120)}", field: rng.randrange(-5, 40)}
            way = i % 3
            if way == 0:
                status, _ = daemon.request("POST", f"/v1/boards/{name}/scores", event)
                assert status == 200
            elif way == 1:
                client.submit_many([event], board=name)
            elif name == "first":
                assert resp.call("ZINCRBY", name, str(event[field]), event["member"])
            else:
                resp.call("ZADD", name, str(event[field]), event["member"])


def _state(daemon: Daemon) -> dict:
    """What the boards answer: every entry in rank order, and each member's
    standing (rank, competition and dense rank) through REST and RESP."""
    out = {}
    with RawClient(daemon.resp_port) as resp:
        for name in BOARDS:
            out[name, "zrange"] = resp.call("ZRANGE", name, "0", "-1", "WITHSCORES")
            out[name, "zrevrank"] = [resp.call("ZREVRANK", name, f"m{i}") for i in range(0, 120, 7)]
            status, top = daemon.request("GET", f"/v1/boards/{name}/top?limit=500")
            assert status == 200
            out[name, "top"] = [(e["rank"], e["member"], e["score"]) for e in top["entries"]]
            for i in range(0, 120, 11):
                status, body = daemon.request("GET", f"/v1/boards/{name}/members/m{i}")
                out[name, i] = (status, {k: body.get(k) for k in (
                    "rank", "competition_rank", "dense_rank", "score")})
    return out


def _dump_versions(data_dir: Path) -> set[int]:
    """The rank index dump versions in the data dir's newest snapshot."""
    newest = sorted((data_dir / "snapshots").glob("snapshot-*.snap"))[-1].read_bytes()
    versions, at = set(), newest.find(b"RKIX")
    while at >= 0:
        versions.add(newest[at + 4])
        at = newest.find(b"RKIX", at + 1)
    return versions


@pytest.mark.parametrize("first, then", [("pages", "skiplist"), ("skiplist", "pages")])
def test_a_data_dir_starts_under_the_other_layout(tmp_path, first, then):
    data_dir = tmp_path / "data"
    with Daemon(data_dir, "--index", first) as daemon:
        assert daemon.wait_for_log(f"index_layout={first}")
        _fill(daemon, seed=1)
        status, _ = daemon.request("POST", "/v1/admin/snapshot")
        assert status == 200
        before = _state(daemon)
    # A board tied by member dumps without seqs on the paged layout only.
    assert _dump_versions(data_dir) == ({1, 2} if first == "pages" else {1})
    with Daemon(data_dir, "--index", then) as daemon:
        assert daemon.wait_for_log(f"index_layout={then}")
        assert _state(daemon) == before
        _fill(daemon, seed=2)  # writes after the move land and snapshot again
        after = _state(daemon)
        status, _ = daemon.request("POST", "/v1/admin/snapshot")
        assert status == 200
    with Daemon(data_dir, "--index", first) as daemon:
        assert _state(daemon) == after


def test_both_layouts_answer_alike(tmp_path):
    """The same writes to a skip-list daemon and a paged one read back the same."""
    states = []
    for kind in ("skiplist", "pages"):
        with Daemon(tmp_path / kind, "--index", kind) as daemon:
            _fill(daemon, seed=3)
            states.append(_state(daemon))
    assert states[0] == states[1]


@pytest.mark.slow
def test_sigkill_under_load_on_the_paged_layout_never_loses_an_acknowledged_write(tmp_path):
    data_dir = tmp_path / "data"
    acked: set[str] = set()
    rng = random.Random(47)
    for cycle in range(4):
        daemon = Daemon(data_dir, "--index", "pages", "--fsync",
                        rng.choice(["everysec", "always"]),
                        "--snapshot-every-events", "2000").start()
        daemon.request("PUT", "/v1/boards/crash", {"policy": "sum"})
        stop, lock = threading.Event(), threading.Lock()

        def resp_load(worker: int, daemon=daemon, stop=stop, cycle=cycle, lock=lock):
            n = 0
            try:
                with RawClient(daemon.resp_port) as resp:
                    while not stop.is_set():
                        member = f"s{cycle}-{worker}-{n}"
                        n += 1
                        if resp.call("ZINCRBY", "crash", "1", member) == b"$1\r\n1\r\n":
                            with lock:
                                acked.add(member)
            except OSError:  # (ConnectionError too): the daemon was killed
                return

        threads = [threading.Thread(target=submit_over_rest, args=(daemon, stop, acked, lock),
                                    kwargs={"prefix": f"r{cycle}-{w}"}) for w in range(2)]
        threads += [threading.Thread(target=resp_load, args=(w,)) for w in range(2)]
        threads += [threading.Thread(target=submit_over_tcp, args=(
            daemon.tcp_port, stop, acked, lock), kwargs={
            "member": f"t{cycle}-{w}", "event": f"t{cycle}-{w}", "batch": 20}) for w in range(2)]
        kill_under_load(daemon, threads, stop, rng.uniform(0.5, 1.2))

    with Daemon(data_dir, "--index", "pages") as daemon:
        assert daemon.wait_for_log("index_layout=pages")
        with Client("127.0.0.1", daemon.tcp_port) as client:
            sample, scores = sorted(acked), {}
            for start in range(0, len(sample), 1000):
                found = client.ranks("crash", sample[start:start + 1000])
                scores.update({e["member"]: e["score"] for e in found["entries"]})
    assert len(acked) > 300
    missing = [member for member in acked if member not in scores]
    doubled = [member for member, score in scores.items() if score != 1.0]
    assert missing == [], f"{len(missing)} acknowledged writes lost"
    assert doubled == [], f"{len(doubled)} writes applied twice"


@pytest.mark.parametrize("tie_break", ["member", "member_desc"])
def test_every_index_loads_a_version_2_dump(python_cls, native_cls, tie_break):
    """The paged index dumps a board tied by member without seqs (version 2);
    the skip list and the pure-Python index once refused it ("unsupported rank
    index dump version 2"), so a paged data dir could not go back."""
    paged = kinds.index_class("pages")("asc", tie_break)
    rng = random.Random(2)
    for _ in range(2000):
        paged.set(f"m{rng.randrange(900)}", rng.randrange(50))
    dump = paged.dump()
    assert dump[4] == 2
    for cls in (python_cls, native_cls):
        loaded = cls.load(dump)
        loaded._check()
        assert list(loaded) == list(paged)
        assert [loaded.dense_rank(m) for m, _ in paged] == [paged.dense_rank(m) for m, _ in paged]
        assert list(kinds.index_class("pages").load(loaded.dump())) == list(paged)
        arrival = bytearray(dump)
        arrival[6] = 0  # tie_break first: version 2 cannot order it
        with pytest.raises(ValueError, match="a version 2 rank index dump"):
            cls.load(bytes(arrival))


@pytest.mark.usefixtures("same_event_id_keys")
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=ingest_cases.scenarios())
def test_native_ingest_on_paged_boards_matches_the_reference(monkeypatch, scenario):
    """The native ingest writes a paged board through its C entry points
    (``rankd/_pages.pxd``, not the reference per submission): the answers,
    records and states it leaves are the reference's."""
    paged = kinds.index_class("pages")
    monkeypatch.setattr(ingest_cases, "new_index_class", lambda: paged)
    before = kinds.current_kind()
    kinds.use("pages")
    try:
        board_configs, batches = scenario
        native = ingest_cases.drive(ingest_cases.native_ingest(), board_configs, batches)
        reference = ingest_cases.drive(ingest_cases.ingest_python, board_configs, batches)
    finally:
        kinds.use(before)
    assert native == reference
