"""Frota imports without cycles: no module imports itself back, through any chain of
imports, in any package; no top-level package (api, plan, operator, engine...) imports
itself back through another; and no part of the engine or the server (a subpackage such
as `frota.engine.quant`, or a top-level module such as `frota.engine.llm_engine`) imports
itself back through another part.

Read from the import statements (ast), so an import inside a function or under
`TYPE_CHECKING` counts too: an import moved into a function to dodge a cycle is still the
cycle. A failure names each cycle as the chain of imports that closes it (a -> b -> a).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOTS = ("frota",)
PACKAGES = {"frota.api", "frota.plan", "frota.operator", "frota.local", "frota.cli",
            "frota.engine", "frota.server", "frota.router"}


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


def package(module: str) -> str:
    """The top-level package of frota a module belongs to (frota.plan.memory: frota.plan)."""
    return ".".join(module.split(".")[:2])


def part(module: str) -> str:
    """The part of the engine or server a module belongs to: its subpackage, or itself."""
    return ".".join(module.split(".")[:3])


def grouped(graph: dict[str, set[str]], group: Callable[[str], str]) -> dict[str, set[str]]:
    """The graph between groups of modules: an edge wherever a module of one imports a
    module of another."""
    groups: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = group(module)
        groups.setdefault(here, set()).update(group(t) for t in targets if group(t) != here)
    return groups


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


def cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """The shortest chain of imports from the component's first module back to it, inside
    the component: [a, b, ..., a]."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & members):
            if target == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{component} is not a cycle of the graph")


def named_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each cycle of the graph, written as the chain that closes it: 'a -> b -> a'."""
    return [" -> ".join(cycle_through(graph, c)) for c in cycles(graph)]


def test_no_module_of_frota_imports_itself_back() -> None:
    graph = import_graph()
    assert {package(m) for m in graph} >= PACKAGES  # the scan found every package
    assert named_cycles(graph) == []


def test_no_package_of_frota_imports_itself_back_through_another() -> None:
    assert named_cycles(grouped(import_graph(), package)) == []


def test_no_part_of_the_engine_or_the_server_imports_itself_back() -> None:
    graph = {m: targets for m, targets in import_graph().items()
             if package(m) in ("frota.engine", "frota.server")}
    parts = grouped(graph, part)
    assert {"frota.engine.quant", "frota.engine.model", "frota.engine.parallel",
            "frota.engine.llm_engine"} <= parts.keys()
    found = named_cycles(parts)
    # Name the modules that close each cycle too, so the failure says where to cut.
    detail = [f"{a} -> {b}" for c in cycles(parts) for a in sorted(graph) for b in sorted(graph[a])
              if part(a) in c and part(b) in c and part(a) != part(b)]
    assert (found, detail) == ([], [])


def test_the_scan_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    package_dir = tmp_path / "frota" / "engine"
    (package_dir / "sub").mkdir(parents=True)
    (package_dir / "__init__.py").write_text("")
    (package_dir / "sub" / "__init__.py").write_text("from .inner import thing\n")
    (package_dir / "sub" / "inner.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from frota.engine.top import Top\n"
        "thing = 1\n")
    (package_dir / "top.py").write_text(
        "def lazily():\n"
        "    from frota.engine.sub import thing\n"
        "    return thing\n"
        "class Top: ...\n")
    graph = import_graph(tmp_path, ("frota",))
    assert graph == {
        "frota.engine": set(),
        "frota.engine.sub": {"frota.engine.sub.inner"},
        "frota.engine.sub.inner": {"frota.engine.top"},
        "frota.engine.top": {"frota.engine.sub"},
    }
    assert cycles(graph) == [["frota.engine.sub", "frota.engine.sub.inner", "frota.engine.top"]]
    assert named_cycles(graph) == [
        "frota.engine.sub -> frota.engine.sub.inner -> frota.engine.top -> frota.engine.sub"]
    assert named_cycles(grouped(graph, part)) == [
        "frota.engine.sub -> frota.engine.top -> frota.engine.sub"]


def test_a_cycle_is_named_by_its_shortest_chain_from_its_first_module() -> None:
    graph = {"a": {"b", "x"}, "b": {"c"}, "c": {"a", "b"}, "x": {"a"}, "y": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "x"]]
    assert named_cycles(graph) == ["a -> x -> a"]
    assert named_cycles({"p": {"q"}, "q": {"r"}, "r": {"p"}, "s": set()}) == ["p -> q -> r -> p"]
