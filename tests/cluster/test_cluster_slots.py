"""Hash slots on disk: a cluster records its grouping scheme in Postgres; a
cluster made by a rankd before hash slots (CRC-32 groups) is refused at
start, nothing changed, until ``rankd cluster migrate-slots`` regroups it;
a node's data dir of before the migration is refused too; a single node's
data dir of before keeps loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cluster_nodes import node, nodes, sql, wait_ready

from daemon import SRC, Daemon

#: The last commit before hash slots (CRC-32 groups).
BEFORE_SLOTS = "891ff0147e96b13a6013ceacfd4cd9fe58c57606"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def old_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rankd's sources as of :data:`BEFORE_SLOTS`, from this repository's
    history (run on their pure-Python modules: nothing to build)."""
    root = tmp_path_factory.mktemp("before-slots")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_SLOTS, "src"],
                             capture_output=True, timeout=120, check=False)
    if archive.returncode != 0:
        pytest.skip(f"this clone's history lacks {BEFORE_SLOTS[:7]} (a shallow clone?): "
                    f"{archive.stderr.decode(errors='replace').strip()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True,
                   timeout=120)
    return root / "src"


def _old_env(old_src: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(old_src), "RANKD_PURE_PYTHON": "1", "RANKD_REQUIRE_NATIVE": ""}
BOARDS = [f"old-{n}" for n in range(40)] + ["{cup}:daily", "{cup}:weekly"]


def _old_node(root: Path, dsn: str, name: str, old_src: Path) -> Daemon:
    return Daemon(root / name, "--cluster-dsn", dsn, "--node-id", name,
                  "--lease-seconds", "1.5", "--log-format", "text", env=_old_env(old_src))


def _migrate(dsn: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankd.cli", "cluster", "migrate-slots",
                           "--dsn", dsn], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})


def test_a_new_cluster_records_the_slot_scheme(tmp_path: Path, pg_dsn: str) -> None:
    with nodes(tmp_path, pg_dsn, 1):
        rows = sql(pg_dsn, "SELECT key, value FROM rankd_cluster_meta")
    assert [(r["key"], r["value"]) for r in rows] == [("board_groups", "crc16-slots")]
    assert (tmp_path / "n0" / "cluster-layout").read_text().strip()
    assert _migrate(pg_dsn).returncode == 1  # nothing to migrate


def test_an_old_cluster_is_refused_until_migrated_and_keeps_every_score(
        tmp_path: Path, pg_dsn: str, old_src: Path) -> None:
    with _old_node(tmp_path, pg_dsn, "n0", old_src) as old:  # (stopped whatever happens)
        wait_ready(old)
        for n, board in enumerate(BOARDS):
            path = f"/v1/boards/{board.replace('{', '%7B').replace('}', '%7D')}"
            assert old.request("PUT", path, {"policy": "sum"})[0] == 201
            for member in range(3):
                status, body = old.request(
                    "POST", f"{path}/scores",
                    {"member": f"m{member}", "delta": n + member, "event_id": f"{board}-{member}"})
                assert status == 200, body

    # A node of this version refuses the cluster, saying what to run; nothing changed.
    before = sql(pg_dsn, "SELECT group_id, epoch, last_seq FROM rankd_groups ORDER BY 1")
    refused = node(tmp_path, pg_dsn, "fresh")
    with pytest.raises(RuntimeError) as failed:
        refused.start()
    assert "rankd cluster migrate-slots --dsn DSN" in str(failed.value)
    assert "before hash slots" in str(failed.value)
    assert sql(pg_dsn, "SELECT group_id, epoch, last_seq FROM rankd_groups ORDER BY 1") == before

    done = _migrate(pg_dsn)
    assert done.returncode == 0, done.stderr
    assert f"regrouped {len(BOARDS)} boards" in done.stdout

    # The old node's data dir holds groups that no longer exist: refused.
    stale = node(tmp_path, pg_dsn, "n0")
    with pytest.raises(RuntimeError) as failed:
        stale.start()
    assert "Move it aside" in str(failed.value)

    from rankd.cluster.groups import group_of
    groups = {row["group_id"] for row in sql(pg_dsn, "SELECT group_id FROM rankd_groups")}
    assert groups == {group_of(board) for board in BOARDS}
    fresh = node(tmp_path, pg_dsn, "fresh2")
    fresh.start()
    try:
        wait_ready(fresh)
        for n, board in enumerate(BOARDS):
            path = f"/v1/boards/{board.replace('{', '%7B').replace('}', '%7D')}"
            status, top = fresh.request("GET", f"{path}/top?limit=10")
            assert status == 200, top
            assert {e["member"]: e["score"] for e in top["entries"]} == {
                f"m{m}": n + m for m in range(3)}
            # Writes go on at the new positions; event ids of before still dedupe.
            status, body = fresh.request("POST", f"{path}/scores",
                                         {"member": "m0", "delta": n, "event_id": f"{board}-0"})
            assert status == 200 and body.get("duplicate"), body
            status, body = fresh.request("POST", f"{path}/scores",
                                         {"member": "m0", "delta": 5, "event_id": f"{board}-x"})
            assert status == 200 and not body.get("duplicate"), body
            assert fresh.request("GET", f"{path}/members/m0")[1]["score"] == n + 5
    finally:
        fresh.stop(timeout=20)


def test_a_single_node_data_dir_of_before_keeps_loading(tmp_path: Path, old_src: Path) -> None:
    data = tmp_path / "single"
    with Daemon(data, env=_old_env(old_src)) as old:
        assert old.request("PUT", "/v1/boards/%7Bcup%7D:daily", {"policy": "sum"})[0] == 201
        assert old.request("POST", "/v1/boards/%7Bcup%7D:daily/scores",
                           {"member": "a", "delta": 7})[0] == 200
    with Daemon(data) as new:
        status, top = new.request("GET", "/v1/boards/%7Bcup%7D:daily/top")
        assert status == 200 and top["entries"][0]["score"] == 7, top
