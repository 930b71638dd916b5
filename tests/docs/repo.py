"""What exists in the repository, for the docs tests to check names against.

The sources live in one tree, src/frota; paths are checked for existence only.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Docs beside the code they describe, checked like DOCS but not linked from the README.
OTHER_DOCS = [ROOT / "e2e" / "kind" / "README.md"]
_SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", ".pytest_cache", ".ruff_cache"}
_TEXT_SUFFIXES = {".py", ".sh", ".cpp", ".yaml", ".yml", ".toml", ".lua", ".cfg"}


def source_roots() -> list[Path]:
    """The directory holding the `frota` package."""
    return [ROOT / "src" / "frota"]


@functools.cache
def ignored_prefixes() -> tuple[str, ...]:
    """Directories .gitignore names: build outputs, never expected to exist in a checkout."""
    out = []
    for line in (ROOT / ".gitignore").read_text().splitlines():
        line = line.strip()
        if line.endswith("/") and "*" not in line:
            out.append(line.lstrip("/"))
    return tuple(out)


def _files() -> list[Path]:
    found = []
    stack = [ROOT]
    ignored = {ROOT / p.rstrip("/") for p in ignored_prefixes()}
    while stack:
        for entry in stack.pop().iterdir():
            if entry.name in _SKIP_DIRS or entry in ignored:
                continue
            if entry.is_dir():
                stack.append(entry)
            else:
                found.append(entry)
    return found


@functools.cache
def file_names() -> frozenset[str]:
    """The base names of every file in the checkout (not build outputs)."""
    return frozenset(p.name for p in _files())


@functools.cache
def corpus() -> str:
    """The text of every source, script, manifest and Dockerfile: where names are defined.

    Not this package's own files: they hold bad names on purpose.
    """
    parts = []
    here = Path(__file__).parent
    for path in _files():
        if path.parent == here:
            continue
        if path.suffix in _TEXT_SUFFIXES or path.name == "Dockerfile":
            try:
                parts.append(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
    return "\n".join(parts)


# -- the frota command line ---------------------------------------------------------------------

@functools.cache
def frota_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every parser of `frota`, by its subcommand path: (), ("worker",), ("eval", "ppl"), ..."""
    from frota.cli.main import SUBCOMMANDS, build_parser

    modules = {name: importlib.import_module(module) for name, (module, _) in SUBCOMMANDS.items()}
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        out[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(modules), ())
    return out


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@functools.cache
def all_frota_flags() -> frozenset[str]:
    return frozenset(flag for parser in frota_parsers().values() for flag in options(parser))


def env_of_flags() -> set[str]:
    """`FROTA_<FLAG>` for every flag of `frota worker` and `frota router` (both read them)."""
    parsers = frota_parsers()
    return {
        "FROTA_" + flag[2:].upper().replace("-", "_")
        for path in (("worker",), ("router",)) for flag in options(parsers[path])
        if flag.startswith("--")
    }


def subcommand(words: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the subcommand path, the remaining words) of `frota WORDS...`."""
    parsers = frota_parsers()
    path: tuple[str, ...] = ()
    rest = list(words)
    while rest and (*path, rest[0]) in parsers:
        path = (*path, rest.pop(0))
    return path, rest


# -- modules -----------------------------------------------------------------------------------

def module_file(dotted: str) -> Path | None:
    """The file or package directory of a module `frota.a.b` or `e2e.a` (None: none exists)."""
    parts = dotted.split(".")
    bases = [r.parent for r in source_roots()] if parts[0] == "frota" else [ROOT]
    for base in bases:
        target = base.joinpath(*parts)
        if target.is_dir():
            return target
        if target.with_suffix(".py").is_file():
            return target.with_suffix(".py")
    return None


def module_text(path: Path) -> str:
    """A module's source; a package's is its `__init__.py` (empty for a namespace package)."""
    if path.is_dir():
        path = path / "__init__.py"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def resolve_dotted(dotted: str) -> str | None:
    """Why `frota.a.b[.attr]` names nothing, or None when it names a module or a module's name."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        path = module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if len(rest) == 1 and re.search(rf"\b{re.escape(rest[0])}\b", module_text(path)):
            return None
        return f"module {'.'.join(parts[:cut])} defines no {'.'.join(rest)}"
    return "no such module"


# -- the InferenceService models -------------------------------------------------------------

def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def field_problem(path: str) -> str | None:
    """Why `spec.a.b` (or `status.x`) is not a field of the InferenceService models, else None.

    A `<role>`-style segment matches any field; list indexes (`[0]`, `[]`) are ignored;
    below a field that is not a model (a map, a list of strings) nothing is checked.
    """
    from frota.api import InferenceService

    model: type[BaseModel] | None = InferenceService
    walked = []
    for segment in path.split("."):
        segment = re.sub(r"\[[^\]]*\]$", "", segment)
        if model is None or not segment:
            return None
        if segment.startswith("<"):
            candidates = [_model_of(f.annotation) for f in model.model_fields.values()]
            model = next((m for m in candidates if m is not None), None)
        elif segment not in model.model_fields:
            where = ".".join(walked) or "the object"
            known = ", ".join(model.model_fields)
            return f"{where} has no field {segment!r} (it has: {known})"
        else:
            model = _model_of(model.model_fields[segment].annotation)
        walked.append(segment)
    return None
