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
