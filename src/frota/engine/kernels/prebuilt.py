"""The C++ kernels built ahead of time for portable ISA levels (the worker image), and loading them.

`python -m frota.engine.kernels --prebuild DIR` compiles every extension of `extensions.EXTENSIONS`
(the attention and layer ops, the int8/int4 matmuls), with its own flags but -march=native
replaced, once per level of `isa.LEVELS` the compiler knows, into `DIR/<level>/`, and writes
`DIR/manifest.json`: the torch version, the machine, a hash of each extension's source and
the levels built.

At run time, with `FROTA_KERNELS_DIR=DIR`, `load(kind)` imports the build of the best level
this CPU runs (`FROTA_KERNELS_ISA=<level>` forces one) and logs which: no compiler needed,
nothing written, so it works on a read-only root filesystem. A manifest for another torch,
machine or source is ignored with a warning, and the engine builds for this CPU as before.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from frota.engine.kernels import isa
from frota.engine.kernels.extensions import EXTENSIONS, compile_extension

log = logging.getLogger("frota.engine.kernels")

DIR_ENV = "FROTA_KERNELS_DIR"
ISA_ENV = "FROTA_KERNELS_ISA"
KINDS = tuple(EXTENSIONS)


def module_name(kind: str, level: isa.IsaLevel) -> str:
    return f"{EXTENSIONS[kind].name}_{level.slug}"


def source_digest(kind: str) -> str:
    return EXTENSIONS[kind].source_digest()


def _portable(cflags: Sequence[str], level: isa.IsaLevel) -> list[str]:
    """`cflags` with -march=native replaced by the level's flags."""
    return [flag for f in cflags for flag in (level.cflags if f == "-march=native" else (f,))]


def _compile(kind: str, name: str, level: isa.IsaLevel, directory: Path) -> None:
    ext = EXTENSIONS[kind]
    compile_extension(ext, name, _portable(ext.cflags, level), directory)


def compiler_supports(level: isa.IsaLevel, cxx: str = "c++") -> bool:
    try:
        return subprocess.run([cxx, *level.cflags, "-x", "c++", "-E", "-o", os.devnull, os.devnull],
                              capture_output=True).returncode == 0
    except OSError:
        return False


@contextlib.contextmanager
def _import_skipped() -> Iterator[bool]:
    """torch's load() imports what it built. A level above the build machine's CPU could die
    of SIGILL in the module's initialisers, so while prebuilding that import is skipped
    (yields False where this torch lacks the hook: then only runnable levels are built)."""
    from torch.utils import cpp_extension

    original = getattr(cpp_extension, "_import_module_from_library", None)
    if original is None:
        yield False
        return
    cpp_extension._import_module_from_library = lambda *args, **kwargs: None
    try:
        yield True
    finally:
        cpp_extension._import_module_from_library = original


def prebuild(out: Path, names: Sequence[str] | None = None) -> list[str]:
    """Build every kind for each level (all of `isa.LEVELS`, or `names`) the compiler
    supports into `out`; returns the levels built. Never uses -march=native."""
    import torch

    unknown = set(names or ()) - set(isa.BY_NAME)
    if unknown:
        raise ValueError(f"unknown ISA levels {sorted(unknown)}; known: {', '.join(isa.BY_NAME)}")
    cxx = os.environ.get("CXX", "c++")
    host = isa.host_cpu_flags() or frozenset()
    out.mkdir(parents=True, exist_ok=True)
    built = []
    if not isa.is_x86_64():  # an empty manifest: the engine compiles on the node, or uses torch
        print(f"[frota.engine] no portable ISA levels are defined for {platform.machine()}; "
              "nothing prebuilt", flush=True)
    with _import_skipped() as skipped:
        for level in isa.LEVELS if isa.is_x86_64() else ():
            if names and level.name not in names:
                continue
            if not compiler_supports(level, cxx):
                print(f"[frota.engine] {level.name}: {cxx} does not support {' '.join(level.cflags)}; skipped",
                      flush=True)
                continue
            if not skipped and not level.cpu_flags <= host:
                print(f"[frota.engine] {level.name}: this CPU cannot load it and this torch cannot build "
                      "without loading; skipped", flush=True)
                continue
            directory = out / level.name
            for kind in KINDS:
                start = time.monotonic()
                _compile(kind, module_name(kind, level), level, directory)
                print(f"[frota.engine] {level.name}: {kind} kernels built in {time.monotonic() - start:.0f} s",
                      flush=True)
            for path in directory.iterdir():  # keep the modules only
                if path.suffix != ".so":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            built.append(level.name)
    manifest = {"torch": torch.__version__, "machine": platform.machine(),
                "sources": {kind: source_digest(kind) for kind in KINDS}, "levels": built}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return built


@functools.cache
def _chosen() -> tuple[Path, isa.IsaLevel, dict] | None:
    """(directory, level, manifest) of the prebuilt kernels to use, or None (logged once)."""
    root = os.environ.get(DIR_ENV)
    if not root:
        return None
    import torch

    try:
        manifest = json.loads((Path(root) / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s=%s has no readable manifest.json (%s); building the C++ kernels for this CPU",
                    DIR_ENV, root, exc)
        return None
    if (manifest.get("torch"), manifest.get("machine")) != (torch.__version__, platform.machine()):
        log.warning("the prebuilt C++ kernels in %s are for torch %s on %s, not torch %s on %s; "
                    "building for this CPU", root, manifest.get("torch"), manifest.get("machine"),
                    torch.__version__, platform.machine())
        return None
    flags = isa.host_cpu_flags()
    levels = manifest.get("levels", [])
    try:
        level = isa.choose_level(levels, flags, torch_capability=torch.backends.cpu.get_cpu_capability(),
                                 override=os.environ.get(ISA_ENV))
    except ValueError as exc:
        log.warning("%s: %s; building the C++ kernels for this CPU", ISA_ENV, exc)
        return None
    if level is None:
        log.warning("no prebuilt C++ kernel level in %s (%s) runs on this CPU; building for this CPU",
                    root, ", ".join(levels) or "none")
        return None
    how = f"forced by {ISA_ENV}" if os.environ.get(ISA_ENV) else f"the best this CPU runs of {', '.join(levels)}"
    log.info("C++ CPU kernels: using the prebuilt %s build (%s) from %s", level.name, how, root)
    return Path(root), level, manifest


def chosen_level() -> str | None:
    """The ISA level the prebuilt kernels load for, or None when they are not used."""
    chosen = _chosen()
    return chosen[1].name if chosen else None


def path(kind: str) -> Path | None:
    """The prebuilt module of `kind` for this CPU, or None (then build it here)."""
    chosen = _chosen()
    if chosen is None:
        return None
    root, level, manifest = chosen
    if manifest.get("sources", {}).get(kind) != source_digest(kind):
        log.warning("the prebuilt %s kernels in %s were built from other sources; building for this CPU",
                    kind, root)
        return None
    module = root / level.name / f"{module_name(kind, level)}.so"
    return module if module.is_file() else None


def load(kind: str) -> ModuleType | None:
    """Import the prebuilt module of `kind` for this CPU, or None (not configured, or failed)."""
    try:
        module_path = path(kind)
        if module_path is None:
            return None
        import torch  # noqa: F401  (the module links against torch's libraries)

        spec = importlib.util.spec_from_file_location(module_path.stem, module_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:
        log.warning("the prebuilt %s kernels failed to load (%s); building for this CPU", kind, exc)
        return None
