"""The import structure of ``src/`` (issue 46), read from the source with ``ast``.

Every import counts, wherever it is written: at module level, under
``TYPE_CHECKING`` or inside a function, since each one ties the modules
together all the same (a module importing another only for its type hints
still cannot be read, moved or tested without it).  The checks:

* the packages form layers, :data:`LAYERS`, lowest first, and no module of
  a layer imports one of a higher layer: the rank indexes know nothing of
  the engine; the engine nothing of the cluster (it implements the
  engine's :mod:`rankd.engine.replication` seam) nor of the front-ends;
  the cluster nothing of the front-ends;
* no import cycle remains anywhere in ``rankd``: a new circle fails here.
  (The engine's rooms take what they need of each other as arguments,
  callables or protocols: :mod:`rankd.engine.host`; the RESP command
  modules take the connection's narrow ``resp.context.Context``.)

``python tests/test_architecture.py [src-dir]`` prints the cycles and the
imports of a higher layer.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: The layers of ``rankd``, lowest first: a module of one imports none of a
#: higher one (the modules of no layer, the daemon's wiring, may import any).
LAYERS = ["rankd.index", "rankd.engine", "rankd.cluster", "rankd.frontends"]

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


@functools.cache
def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each ``rankd`` module -> the ``rankd`` modules it imports (read once
    per tree: do not change the result)."""
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


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``module -> imported`` for each import of a higher layer (:data:`LAYERS`)."""
    return [line for position, lower in enumerate(LAYERS) for higher in LAYERS[position + 1:]
            for line in upward_imports(graph, lower, higher)]


def test_no_module_imports_a_higher_layer():
    assert layer_violations(import_graph()) == []


def test_engine_does_not_import_the_cluster_nor_the_front_ends():
    graph = import_graph()
    assert upward_imports(graph, "rankd.engine", "rankd.cluster") == []
    assert upward_imports(graph, "rankd.engine", "rankd.frontends") == []


def test_the_indexes_do_not_import_the_engine():
    assert upward_imports(import_graph(), "rankd.index", "rankd.engine") == []


def test_no_import_cycle_anywhere():
    assert cycles(import_graph(), "rankd") == []


def test_the_engine_and_the_cluster_have_no_cycle():
    graph = import_graph()
    assert cycles(graph, "rankd.engine") == []
    assert cycles(graph, "rankd.cluster") == []


def test_a_new_cycle_or_an_upward_import_is_found(tmp_path):
    """The checks fail on a tree with a circle (across packages, or within
    one) and on an import of a higher layer."""
    for package in ("engine", "cluster", "frontends/resp"):
        (tmp_path / "rankd" / package).mkdir(parents=True)
        (tmp_path / "rankd" / package / "__init__.py").write_text("")
    (tmp_path / "rankd" / "__init__.py").write_text("")
    (tmp_path / "rankd" / "engine" / "a.py").write_text("from rankd.engine import b\n")
    (tmp_path / "rankd" / "engine" / "b.py").write_text("import rankd.cluster.c\n")
    (tmp_path / "rankd" / "cluster" / "c.py").write_text("from rankd.engine.a import x\n")
    resp = tmp_path / "rankd" / "frontends" / "resp"
    (resp / "commands.py").write_text("from rankd.frontends.resp import connection\n")
    (resp / "connection.py").write_text("from rankd.frontends.resp import newcomer\n")
    (resp / "newcomer.py").write_text("from rankd.frontends.resp import commands\n")
    graph = import_graph(tmp_path)
    assert sorted(map(sorted, cycles(graph, "rankd"))) == [
        ["rankd.cluster.c", "rankd.engine.a", "rankd.engine.b"],
        ["rankd.frontends.resp.commands", "rankd.frontends.resp.connection",
         "rankd.frontends.resp.newcomer"]]
    assert layer_violations(graph) == ["rankd.engine.b -> rankd.cluster.c"]
    (resp / "newcomer.py").unlink()
    (resp / "connection.py").write_text("from rankd.frontends.resp import commands\n")
    import_graph.cache_clear()  # (the tree changed)
    graph = import_graph(tmp_path)
    assert sorted(map(sorted, cycles(graph, "rankd"))) == [
        ["rankd.cluster.c", "rankd.engine.a", "rankd.engine.b"],
        ["rankd.frontends.resp.commands", "rankd.frontends.resp.connection"]]


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


# --- the front-ends (issue 46: the RESP port's circle) -----------------------------------
#: The RESP module that assembles the command table, and the connection's.
RESP_TABLE = "rankd.frontends.resp.commands"
RESP_CONNECTION = "rankd.frontends.resp.connection"


def test_frontends_have_no_import_cycle():
    """No circle among the front-end modules: the RESP command modules take
    the connection's narrow ``resp.context.Context``, the table imports
    them, the connection imports the table, never the reverse."""
    assert cycles(import_graph(), "rankd.frontends") == []


def test_resp_commands_import_neither_the_table_nor_the_connection():
    """A RESP command module imports neither ``connection.py`` nor the
    table (what they share is ``resp/context.py``'s); only the connection
    imports the table."""
    graph = import_graph()
    found = [f"{name} -> {target}" for name, targets in graph.items()
             if name.startswith("rankd.frontends.resp.")
             for target in sorted(targets)
             if target == RESP_CONNECTION or (target == RESP_TABLE and name != RESP_CONNECTION)]
    assert found == []


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    imports = import_graph(source)
    for cycle in cycles(imports, "rankd"):
        print("cycle:", " ".join(sorted(cycle)))
    for line in layer_violations(imports):
        print("imports a higher layer:", line)
