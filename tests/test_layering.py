"""The one source tree keeps its layers: data plane never reaches into the control plane.

The dependency direction (docs/internals.md): api <- operator, local, cli; api <- engine <- server;
api <- router. Read from the import statements of every module (ast), so a lazy
import inside a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "frota"
# part -> parts it must never import
FORBIDDEN = {
    "engine": ("frota.operator", "frota.local", "frota.cli", "frota.server", "frota.router"),
    "server": ("frota.operator", "frota.local", "frota.cli", "frota.router"),
    "router": ("frota.operator", "frota.local", "frota.cli", "frota.engine", "frota.server"),
    "api": ("frota.operator", "frota.local", "frota.cli", "frota.engine", "frota.server",
            "frota.router"),
    "operator": ("frota.engine", "frota.server", "frota.router", "frota.local"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_a_part_imports_only_the_layers_below_it(part: str) -> None:
    bad = [
        f"{path.relative_to(SRC.parent)}:{line}: import {name}"
        for path in sorted((SRC / part).rglob("*.py"))
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[part])
    ]
    assert bad == []


def test_the_control_plane_imports_without_torch() -> None:
    # What keeps the operator image torch-free.
    code = ("import sys, frota.api, frota.api.contract, frota.operator.handlers, "
            "frota.operator.render_cli, frota.local.up, frota.cli.main; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
