"""Every public function and method of the engine says what it returns, so a caller (the
server, the CLI, a test) reads the contract from the signature. Read from the source (ast):
no torch import."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "src" / "frota" / "engine"
# dunders a caller calls (forward is public: nn.Module's __call__ returns what it returns)
CALLED_DUNDERS = {"__call__", "__len__", "__getitem__", "__iter__", "__enter__", "__exit__"}


def unannotated(source: str, where: str) -> list[str]:
    """`where:line name` of each public function or method in `source` without a return type."""
    found = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{owner}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                public = not child.name.startswith("_") or child.name in CALLED_DUNDERS
                if public and child.returns is None:
                    found.append(f"{where}:{child.lineno} {owner}{child.name}")

    visit(ast.parse(source, filename=where), "")
    return found


def test_every_public_function_of_the_engine_says_what_it_returns() -> None:
    missing = [entry for path in sorted(ENGINE.rglob("*.py"))
               for entry in unannotated(path.read_text(), str(path.relative_to(ENGINE)))]
    assert not missing, "no return type: " + ", ".join(missing)


def test_the_check_finds_a_public_method_without_a_return_type() -> None:
    source = ("class Engine:\n    def step(self):\n        pass\n\n    def _hidden(self):\n"
              "        pass\n\n    def stats(self) -> int:\n        return 0\n\n"
              "class _Private:\n    def run(self):\n        pass\n\n"
              "def load(path):\n    pass\n")
    assert unannotated(source, "probe.py") == ["probe.py:2 Engine.step", "probe.py:15 load"]
