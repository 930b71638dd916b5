"""How every C++ CPU kernel is loaded: one table of extensions (`extensions.py`), one cache,
one switch.

An extension is some of this directory's .cpp files, compiled by torch's cpp_extension into
one Python module. `load(kind)` returns it, once per process:

1. None when the kernels are switched off (`enabled`): the callers' PyTorch paths run.
2. The worker image's build for this CPU's ISA level, when `FROTA_KERNELS_DIR` names one
   (prebuilt.py, which builds them with the flags of `extensions.py`, -march=native replaced
   per level).
3. Otherwise a build for this CPU (`-march=native`), compiled on first use and cached under
   `cache_root()`: one directory per extension, sources, flags, torch version and CPU, so a
   change rebuilds and nothing stale is loaded.
4. None, with a warning, where that build fails (no compiler, no headers).

No torch is imported until a build or a load needs it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import time
from pathlib import Path
from types import ModuleType

from frota.engine.kernels import extensions, prebuilt
from frota.engine.kernels.extensions import EXTENSIONS, Extension

log = logging.getLogger("frota.engine.kernels")

SWITCH_ENV = "FROTA_CPU_KERNELS"  # "0": no C++ kernel at all
QUANT_SWITCH_ENV = "FROTA_QUANT_KERNELS"  # "torch": the quant kernels alone off (the older switch)
CACHE_ENV = "FROTA_KERNEL_CACHE"


def enabled(kind: str = "attention") -> bool:
    """Whether the `kind` kernels may be used: `FROTA_CPU_KERNELS=0` turns every one off,
    `FROTA_QUANT_KERNELS=torch` the quant ones alone."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    return not (kind == "quant" and os.environ.get(QUANT_SWITCH_ENV, "").lower() == "torch")


def cache_root() -> Path:
    """Where every Frota C++ build lives: `$FROTA_KERNEL_CACHE`, else `$XDG_CACHE_HOME/frota/kernels`
    (`~/.cache/frota/kernels`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frota" / "kernels"


def cpu_flags() -> str:
    """The CPU's feature flags: a `-march=native` build is only reused on a like CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_directory(ext: Extension) -> Path:
    """The cache directory of `ext`'s build for this CPU."""
    import torch

    key = hashlib.sha256()
    for path in ext.inputs:
        key.update(path.read_bytes())
    key.update(" ".join((*ext.cflags, *ext.ldflags, torch.__version__, platform.machine(),
                         cpu_flags())).encode())
    return cache_root() / f"{ext.name}-{key.hexdigest()[:16]}"


def is_built(kind: str = "attention") -> bool:
    """Whether `load(kind)` will find a prebuilt or cached build rather than compile."""
    return prebuilt.path(kind) is not None or any(build_directory(EXTENSIONS[kind]).glob("*.so"))


_loaded: dict[str, ModuleType | None] = {}


def load(kind: str) -> ModuleType | None:
    """The `kind` kernels module (see the module docstring), or None; decided once per process."""
    if kind not in _loaded:
        started = time.monotonic()
        _loaded[kind] = _load(EXTENSIONS[kind])
        if _loaded[kind] is not None:  # how long a cold start spends here (a compile, or a load)
            seconds = round(time.monotonic() - started, 3)
            log.info("C++ %s kernels ready in %.2f s", kind, seconds,
                     extra={"fields": {"kernels": kind, "kernel_load_s": seconds}})
    return _loaded[kind]


def _load(ext: Extension) -> ModuleType | None:
    if not enabled(ext.kind):
        log.info("the C++ %s kernels are switched off; using %s", ext.kind, ext.fallback)
        return None
    module = prebuilt.load(ext.kind)
    if module is not None:
        return module
    try:
        return extensions.compile_extension(ext, ext.name, list(ext.cflags), build_directory(ext))
    except Exception as exc:  # no compiler, no headers, a failed build: fall back, loudly
        log.warning("C++ %s kernels unavailable, using %s: %s", ext.kind, ext.fallback, exc)
        return None
