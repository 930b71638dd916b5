"""The engine and the server import without cycles: no module imports itself back, and no
part of the engine (a subpackage such as `quant` or `parallel`, or a top-level module such as
`llm_engine`) imports itself back through another part.

Read from the import statements (ast), so an import inside a function or under
`TYPE_CHECKING` counts too: an import moved into a function to dodge a cycle is still the
cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOTS = ("frota.engine", "frota.server")


def modules(src: Path, roots: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file of every module under `roots` (a package is its __init__.py)."""
    found = {}
    for root in roots:
        for path in (src / Path(*root.split("."))).rglob("*.py"):
            parts = path.relative_to(src).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(name: str, path: Path) -> Iterator[str]:
    """Each module or name an import statement of `name` reaches for, as a dotted name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import x` imports the module pkg.x when there is one, else pkg itself.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(src: Path = SRC, roots: tuple[str, ...] = ROOTS) -> dict[str, set[str]]:
    """Module -> the modules under `roots` it imports, at any level of the file."""
    known = modules(src, roots)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for imported in _imported_names(name, path):
            while imported and imported not in known:  # a name inside a module: that module
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def part(module: str) -> str:
    """The part of the engine a module belongs to: its subpackage, or itself."""
    pieces = module.split(".")
    return ".".join(pieces[:3])


def by_part(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between parts: an edge wherever a module of one imports a module of another."""
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        parts.setdefault(part(module), set()).update(part(t) for t in targets if part(t) != part(module))
    return parts


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _edges_within(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component]


def test_no_module_of_the_engine_or_the_server_imports_itself_back() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the scan found the tree
    assert [_edges_within(graph, c) for c in cycles(graph)] == []


def test_no_part_of_the_engine_or_the_server_imports_itself_back() -> None:
    graph = import_graph()
    parts = by_part(graph)
    assert {"frota.engine.quant", "frota.engine.model", "frota.engine.parallel",
            "frota.engine.llm_engine"} <= parts.keys()
    found = cycles(parts)
    # Name the modules that close each cycle, so the failure says where to cut.
    detail = [[f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a])
               if part(a) in c and part(b) in c and part(a) != part(b)] for c in found]
    assert detail == []


def test_the_scan_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "frota" / "engine"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .inner import thing\n")
    (package / "sub" / "inner.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from frota.engine.top import Top\n"
        "thing = 1\n")
    (package / "top.py").write_text(
        "def lazily():\n"
        "    from frota.engine.sub import thing\n"
        "    return thing\n"
        "class Top: ...\n")
    graph = import_graph(tmp_path, ("frota.engine",))
    assert graph == {
        "frota.engine": set(),
        "frota.engine.sub": {"frota.engine.sub.inner"},
        "frota.engine.sub.inner": {"frota.engine.top"},
        "frota.engine.top": {"frota.engine.sub"},
    }
    assert cycles(graph) == [["frota.engine.sub", "frota.engine.sub.inner", "frota.engine.top"]]
    assert cycles(by_part(graph)) == [["frota.engine.sub", "frota.engine.top"]]
