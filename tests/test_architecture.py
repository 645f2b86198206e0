"""The engine's import structure (issue 46), read from the source with ``ast``.

Every import counts, wherever it is written: at module level, under
``TYPE_CHECKING`` or inside a function, since each one ties the modules
together all the same (a module importing another only for its type hints
still cannot be read, moved or tested without it).  The checks:

* no engine module imports ``rankd.cluster``: the cluster is built on the
  engine (it implements the engine's :mod:`rankd.engine.replication` seam),
  never the reverse;
* the engine modules' import cycles are exactly :data:`KNOWN_CYCLES`: the
  value types and the Postgres shipper no longer form a circle with
  ``engine.py``, and a new circle fails here.

``python tests/test_architecture.py [src-dir]`` prints the cycles and the
engine's imports of the cluster.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: Cycles left among the engine's modules, each as a set of module names:
#: none since the façade was split into rooms (``staging`` and
#: ``transaction`` take the narrow ``rankd.engine.host.WriteHost``).
KNOWN_CYCLES: list[set[str]] = []

def module_name(path: Path, src: Path) -> str:
    """``src/rankd/engine/ingest.py`` -> ``rankd.engine.ingest``."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, modules: set[str]) -> Iterator[str]:
    """The ``rankd`` modules ``path`` imports anywhere in it (``from package
    import module`` names the module, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("rankd"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                 *filter(None, [base])])
            if not base.startswith("rankd"):
                continue
            for alias in node.names:
                inner = f"{base}.{alias.name}"
                yield inner if inner in modules else base


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each ``rankd`` module -> the ``rankd`` modules it imports."""
    paths = {module_name(path, src): path for path in (src / "rankd").rglob("*.py")}
    modules = set(paths)
    return {name: set(imports_of(path, name, modules)) - {name}
            for name, path in sorted(paths.items())}


def cycles(graph: dict[str, set[str]], within: str) -> list[set[str]]:
    """The strongly connected components of more than one module among the
    modules named ``within...`` (Tarjan's algorithm)."""
    nodes = [name for name in graph if name.startswith(within)]
    edges = {name: sorted(t for t in graph[name] if t in graph and t.startswith(within))
             for name in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, set[str]], lower: str, higher: str) -> list[str]:
    """``module -> imported`` for each module under ``lower`` importing one
    under ``higher``."""
    return [f"{name} -> {target}" for name, targets in graph.items() if name.startswith(lower)
            for target in sorted(targets) if target.startswith(higher)]


def test_engine_does_not_import_the_cluster():
    assert upward_imports(import_graph(), "rankd.engine", "rankd.cluster") == []


def test_engine_cycles_are_only_the_known_ones():
    found = cycles(import_graph(), "rankd.engine")
    assert sorted(map(sorted, found)) == sorted(map(sorted, KNOWN_CYCLES))


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Module-level, ``TYPE_CHECKING``, function-level and relative imports
    all count, and ``from package import module`` names the module."""
    package = tmp_path / "rankd" / "engine"
    package.mkdir(parents=True)
    (tmp_path / "rankd" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from rankd.engine.b import B\n")
    (package / "b.py").write_text("def f():\n    from rankd.engine import c\n")
    (package / "c.py").write_text("from .a import A\n")
    (package / "d.py").write_text("import rankd.engine.a\n")
    graph = import_graph(tmp_path)
    assert graph["rankd.engine.b"] == {"rankd.engine.c"}
    assert graph["rankd.engine.d"] == {"rankd.engine.a"}
    assert cycles(graph, "rankd.engine") == [
        {"rankd.engine.a", "rankd.engine.b", "rankd.engine.c"}]


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    imports = import_graph(source)
    for cycle in cycles(imports, "rankd.engine"):
        print("cycle:", " ".join(sorted(cycle)))
    for line in upward_imports(imports, "rankd.engine", "rankd.cluster"):
        print("engine imports the cluster:", line)
