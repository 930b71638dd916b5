"""The one source tree keeps its layers: data plane never reaches into the control plane.

The dependency direction (docs/internals.md): api <- plan <- operator, local; cli on top;
api <- engine <- server; api <- router. The planner (plan) is pure: no kopf, torch or
aiohttp, and `frota up` (local) reaches it without the operator. Read from the import
statements of every module (ast), so a lazy import inside a function counts too, except
where a rule allows only lazy imports: `frota up` (local) and the `frota` command (cli)
run the data plane on a machine with the engine extra, from inside a function, while
importing them stays torch-free for the operator image. The data plane also names no control-plane module in a
string (a `-c` code string or a `-m` argument would start one without an import).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "frota"
DATA_PLANE = ("frota.engine", "frota.server", "frota.router")
CONTROL_PLANE = ("frota.plan", "frota.operator", "frota.local", "frota.cli")
# part -> parts it must never import, at any level
FORBIDDEN = {
    "engine": (*CONTROL_PLANE, "frota.server", "frota.router"),
    "server": (*CONTROL_PLANE, "frota.router"),
    "router": (*CONTROL_PLANE, "frota.engine", "frota.server"),
    "api": (*CONTROL_PLANE, *DATA_PLANE),
    "plan": ("frota.operator", "frota.local", "frota.cli", *DATA_PLANE, "kopf", "torch", "aiohttp"),
    "operator": (*DATA_PLANE, "frota.local", "frota.cli"),
    "local": ("frota.operator", "frota.cli"),
}
# part -> parts it may import only inside a function, never at module level
LAZY_ONLY = {
    "local": DATA_PLANE,
    "cli": DATA_PLANE,
}
NAMES_CONTROL_PLANE = re.compile(r"\bfrota\.(plan|operator|local|cli)\b")


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) of each absolute import; a class body is module
    level (it runs at import), a function body is not."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy = {id(node) for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for node in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, id(node) not in lazy) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, id(node) not in lazy))
    return found


def _strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string constant but docstrings, f-string parts included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)
    }
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def _under(name: str, parts: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in parts)


@pytest.mark.parametrize("part", sorted(FORBIDDEN.keys() | LAZY_ONLY.keys()))
def test_a_part_imports_only_the_layers_below_it(part: str) -> None:
    bad = [
        f"{path.relative_to(SRC.parent)}:{line}: import {name}"
        + ("" if _under(name, FORBIDDEN.get(part, ())) else " at module level")
        for path in sorted((SRC / part).rglob("*.py"))
        for line, name, at_module_level in _imports(path)
        if _under(name, FORBIDDEN.get(part, ()))
        or (at_module_level and _under(name, LAZY_ONLY.get(part, ())))
    ]
    assert bad == []


def test_builders_render_what_the_topology_says_without_asking_the_planner_again() -> None:
    """The planner decides once (`frota.plan.planner.plan`); a builder reads the Topology's
    answers, so what `frota plan` shows and what the operator renders cannot drift."""
    bad = [
        f"{path.relative_to(SRC.parent)}:{line}: import {name}"
        for path in sorted((SRC / "operator" / "builders").rglob("*.py"))
        for line, name, _ in _imports(path)
        if _under(name, ("frota.plan.planner",))
    ]
    assert bad == []


@pytest.mark.parametrize("part", ["engine", "server", "router"])
def test_the_data_plane_starts_no_control_plane_module_by_name(part: str) -> None:
    bad = [
        f"{path.relative_to(SRC.parent)}:{line}: {text!r}"
        for path in sorted((SRC / part).rglob("*.py"))
        for line, text in _strings(path)
        if NAMES_CONTROL_PLANE.search(text)
    ]
    assert bad == []


def test_the_scanners_see_lazy_imports_and_code_strings_but_not_docstrings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""Started like `frota.cli.main` would be."""\n'
        "import frota.engine\n"
        "class C:\n"
        "    from frota.server import app\n"
        "def f(port):\n"
        "    from frota.router import cli\n"
        "    return ['-m', 'frota.local.up', f'import frota.cli.main; {port}']\n"
    )
    assert _imports(module) == [(2, "frota.engine", True), (4, "frota.server", True),
                                (6, "frota.router", False)]
    named = [line for line, text in _strings(module) if NAMES_CONTROL_PLANE.search(text)]
    assert named == [7, 7]


def test_the_control_plane_imports_without_torch() -> None:
    # What keeps the operator image torch-free.
    code = ("import sys, frota.api, frota.api.contract, frota.plan.planner, frota.plan.cli, "
            "frota.operator.loop.handlers, frota.operator.render_cli, frota.local.up, frota.cli.main; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_the_planner_loads_neither_kopf_nor_torch_nor_aiohttp() -> None:
    # What lets `frota plan` and `frota up` plan on a machine with none of them: the
    # ast rules above see the planner's own imports, this also what they import in turn.
    code = ("import sys, frota.plan.planner, frota.plan.describe, frota.plan.cli; "
            "sys.exit(sorted({'kopf', 'torch', 'aiohttp'} & sys.modules.keys()) or 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (0, "")
