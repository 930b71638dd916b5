"""Small C++ kernels for the CPU, compiled on first use and cached.

PyTorch has no paged attention for the CPU: expressed with its ops, decode
attention must gather every block of every sequence into a new tensor before
it can multiply, which copies the whole KV context once per layer per step.
`paged_attention.cpp` reads the pool in place instead. It is compiled with the
system C++ compiler the first time an engine needs it (about a minute, once
per machine and torch version; the result is cached under
`$XDG_CACHE_HOME/frota/kernels`), for the machine it runs on (`-march=native`).

Without a compiler, or with `FROTA_CPU_KERNELS=0`, `cpu_kernels()` returns
None and the engine uses its PyTorch paths, which compute the same thing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

SOURCES = (Path(__file__).with_name("paged_attention.cpp"),)
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")


def enabled() -> bool:
    return os.environ.get("FROTA_CPU_KERNELS", "1") != "0"


def build_directory() -> Path:
    """One directory per (sources, flags, torch version, CPU), so a change rebuilds."""
    import torch

    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.read_bytes())
    key.update(" ".join((*CFLAGS, torch.__version__, platform.machine(), _cpu_flags())).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frota" / "kernels"
    return root / key.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def is_built() -> bool:
    """Whether `cpu_kernels()` will load a cached build rather than compile."""
    return any(build_directory().glob("*.so"))


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled kernels module, or None (disabled, or no working compiler)."""
    if not enabled():
        return None
    try:
        from torch.utils.cpp_extension import load

        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        return load(name="frota_cpu_kernels", sources=[str(s) for s in SOURCES],
                    extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                    build_directory=str(directory))
    except Exception as exc:  # no compiler, no headers, a failed build: fall back, loudly
        log.warning("C++ CPU kernels unavailable, using the PyTorch attention path: %s", exc)
        return None
