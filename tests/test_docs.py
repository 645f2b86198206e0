"""The documentation matches the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankd import docs
from rankd.config import OPTIONS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(docs.PAGES))
def test_generated_reference_pages_are_current(name):
    committed = (ROOT / "docs" / name).read_text()
    assert committed == docs.PAGES[name](), f"docs/{name} is stale: run python -m rankd.docs"


def test_every_setting_and_endpoint_is_documented():
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    for option in OPTIONS:
        assert option.flag in configuration and option.env in configuration
    rest = (ROOT / "docs" / "rest.md").read_text()
    from rankd.frontends.openapi import openapi_document

    for path in openapi_document()["paths"]:
        assert path in rest


def test_links_between_documents_resolve():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_readme_gives_the_two_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' "
                    "&& .venv/bin/python -m pytest")
    assert test_command in readme and test_command in ci
    assert ".venv/bin/rankd serve" in readme


def test_measured_figures_live_only_in_bench_results():
    """README, durability.md and operations.md once quoted different figures
    for the same thing.  The user docs point at bench/RESULTS.md instead
    (settings and limits, which are not measurements, stay)."""
    measured = re.compile(r"\b\d[\d.,]*\s?(ms|us|µs)\b|\b\d[\d.,]*\s?(k|M)?(events|ev)/s\b"
                          r"|\bbytes (each|per member)\b")
    for name in ("durability.md", "operations.md", "live.md", "security.md", "index.md"):
        text = (ROOT / "docs" / name).read_text()
        found = [m.group(0) for m in measured.finditer(text)]
        assert not found, f"docs/{name} quotes measured figures {found}: cite bench/RESULTS.md"


def test_the_docs_say_windows_are_utc():
    assert "UTC" in (ROOT / "README.md").read_text()
    assert "UTC" in (ROOT / "docs" / "live.md").read_text()


RECIPE_PORTS = (7700, 7701, 7702, 7710, 7711, 7712, 7720, 7721, 7722)


def _recipe() -> str:
    text = (ROOT / "docs" / "cluster.md").read_text()
    section = text.split("## Three nodes on one machine", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)


def _get(url: str, body: object = None, method: str = "GET") -> object:
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=15) as response:
        return json.loads(response.read() or b"null")


def test_the_loopback_cluster_recipe_runs_as_printed(tmp_path, pg_cluster):
    """docs/cluster.md's three-node recipe, pasted into bash against a
    throwaway Postgres (PGPORT points at it): the role and database are
    made, three nodes start on their own ports and join, and any of them
    takes a write and serves it."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from daemon import SRC

    for port in RECIPE_PORTS:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"port {port}, which the recipe uses, is taken on this machine")
    env = {"PATH": f"{Path(sys.executable).parent}:{pg_cluster.bin_dir}:/usr/bin:/bin",
           "PYTHONPATH": str(SRC), "PGHOST": "127.0.0.1", "PGPORT": str(pg_cluster.port),
           "PGUSER": "postgres", "HOME": str(tmp_path)}
    output = tmp_path / "recipe.out"
    with open(output, "wb") as out:
        shell = subprocess.Popen(["bash", "-eu", "-c", _recipe()], cwd=tmp_path, env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            assert shell.wait(120) == 0, output.read_text()
        except subprocess.TimeoutExpired:
            logs = "".join(p.read_text()[-2000:] for p in tmp_path.glob("rankd-*.log"))
            pytest.fail(f"the recipe did not finish in 120 s:\n{output.read_text()}\n{logs}")
        status = output.read_text()
        for node in "abc":
            assert re.search(rf"^node {node}\s.*\salive(, .* free)?$", status, re.MULTILINE), status
        _get("http://127.0.0.1:7700/v1/boards/arena", {"policy": "best"}, "PUT")
        written = _get("http://127.0.0.1:7710/v1/boards/arena/scores",
                       {"member": "ann", "score": 42}, "POST")
        top = _get(f"http://127.0.0.1:7720/v1/boards/arena/top?min_seq={written['seq']}")
        assert [(e["member"], e["score"]) for e in top["entries"]] == [("ann", 42)]
    finally:
        # The nodes run in the shell's process group (no job control):
        # SIGTERM it, and wait (bounded) for every node to leave.
        group = shell.pid
        try:
            os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                os.killpg(group, 0)
                time.sleep(0.2)
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_readme_layout_matches_the_tree():
    """README's layout block once listed wire.py and config.py under
    clients/js/.  Each name in its first column is where the block's
    indentation puts it: a top-level path, or one inside the entry above."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Layout\n\n```\n(.*?)```", readme, re.DOTALL).group(1)
    parent = ROOT
    checked = 0
    for line in block.splitlines():
        first_column = re.split(r"\s{2,}", line.strip())[0]
        if not line.strip() or line.startswith(" " * 4):  # a description continued
            continue
        names = [name.strip() for name in first_column.split(",")]
        base = ROOT if not line.startswith(" ") else parent
        for name in names:
            assert (base / name).exists(), f"README's layout lists {name} in " \
                                           f"{base.relative_to(ROOT) or '.'}/, not there"
            checked += 1
        if not line.startswith(" ") and names[0].endswith("/"):
            parent = ROOT / names[0]
    assert checked >= 15
