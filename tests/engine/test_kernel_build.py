"""One build for every C++ kernel (frota.engine.kernels.build): its table of extensions, its
switches, and the worker image's prebuild step, which must be given every file it imports."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from frota.engine.kernels import build, extensions

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"


def test_every_cpp_file_belongs_to_exactly_one_extension():
    owned = [source for ext in extensions.EXTENSIONS.values() for source in ext.sources]
    assert sorted(owned) == sorted(path.name for path in extensions.SOURCE_DIR.glob("*.cpp"))
    assert all(path.is_file() for ext in extensions.EXTENSIONS.values() for path in ext.paths)


def test_the_package_ships_the_cpp_sources():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.cpp" in package_data["*"]


def test_each_extension_has_its_own_cache_directory(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    for ext in extensions.EXTENSIONS.values():
        directory = build.build_directory(ext)
        assert directory.parent == tmp_path and directory.name.startswith(f"{ext.name}-")


@pytest.mark.parametrize(("env", "attention", "quant"), [
    ({}, True, True),
    ({"FROTA_CPU_KERNELS": "0"}, False, False),
    ({"FROTA_QUANT_KERNELS": "torch"}, True, False),  # the older switch still works, for quant alone
])
def test_one_switch_turns_every_kernel_off(monkeypatch, env, attention, quant):
    for name in (build.SWITCH_ENV, build.QUANT_SWITCH_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (build.enabled("attention"), build.enabled("quant")) == (attention, quant)


def test_a_switched_off_kernel_is_neither_built_nor_loaded(monkeypatch):
    def must_not_build(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("built although switched off")

    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(extensions, "compile_extension", must_not_build)
    monkeypatch.setenv(build.SWITCH_ENV, "0")
    assert build.load("attention") is None and build.load("quant") is None


def _frota_imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("frota"):
            imported |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.startswith("frota")}
    return imported


def test_the_image_prebuild_step_copies_every_module_it_imports():
    """The worker image prebuilds in /tmp/kbuild from a few copied files, before Frota is
    installed: a module the prebuild imports but the Dockerfile does not copy breaks the image."""
    dockerfile = (ROOT / "worker_image" / "Dockerfile").read_text().replace("\\\n", " ")
    copied: set[Path] = set()
    for line in dockerfile.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1].startswith("/tmp/kbuild/"):
            copied |= {path for pattern in words[1:-1] for path in ROOT.glob(pattern)}
    assert copied, "no COPY into /tmp/kbuild in worker_image/Dockerfile"
    assert {path for ext in extensions.EXTENSIONS.values() for path in ext.paths} <= copied
    todo, seen = [SOURCE / "frota/engine/kernels/__main__.py"], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _frota_imports(path):
            module = SOURCE / Path(*name.split("."))
            for candidate in (module.with_suffix(".py"), module / "__init__.py"):
                if candidate.is_file() and candidate != SOURCE / "frota/engine/__init__.py":
                    todo.append(candidate)
    assert seen <= copied, f"imported by the prebuild but not copied: {sorted(map(str, seen - copied))}"
    assert re.search(r"python -m frota\.engine\.kernels --prebuild", dockerfile)
