"""Small C++ kernels for the CPU, compiled on first use and cached.

PyTorch has no paged attention for the CPU: expressed with its ops, decode
attention must gather every block of every sequence into a new tensor before
it can multiply, which copies the whole KV context once per layer per step.
`paged_attention.cpp` reads the pool in place instead. `layer_ops.cpp` fuses
the chains of small ops around the matmuls (RMSNorm with its residual add,
RoPE with the KV cache write, SiLU-and-multiply): at decode batch sizes their
dispatch overhead is most of a step's time outside the matmuls.

They are compiled with the system C++ compiler the first time an engine needs
them (a minute or two, once per machine and torch version; `python -m
frota.engine.kernels` does it ahead of time; the result is cached under
`cache_root()`), for the machine they run on (`-march=native`).

The worker image carries them prebuilt instead, for portable ISA levels
(`isa.py`, `prebuilt.py`): with `FROTA_KERNELS_DIR` set, the best level this CPU
runs is loaded and nothing is compiled.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("paged_attention.cpp", "layer_ops.cpp", "bindings.cpp"))
CFLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")


def enabled() -> bool:
    return os.environ.get("FROTA_CPU_KERNELS", "1") != "0"


def build_directory() -> Path:
    """One directory per (sources, flags, torch version, CPU), so a change rebuilds."""
    import torch

    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.read_bytes())
    key.update(" ".join((*CFLAGS, torch.__version__, platform.machine(), cpu_flags())).encode())
    return cache_root() / key.hexdigest()[:16]


def cache_root() -> Path:
    """Where every Frota C++ build lives: `$FROTA_KERNEL_CACHE`, else `$XDG_CACHE_HOME/frota/kernels`
    (`~/.cache/frota/kernels`)."""
    if os.environ.get("FROTA_KERNEL_CACHE"):
        return Path(os.environ["FROTA_KERNEL_CACHE"])
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


def for_tensor(t: torch.Tensor) -> ModuleType | None:
    """The kernels module when `t` is on the CPU and the kernels are available."""
    return cpu_kernels() if t.device.type == "cpu" else None


def is_built() -> bool:
    """Whether `cpu_kernels()` will load a prebuilt or cached build rather than compile."""
    from frota.engine.kernels import prebuilt

    return prebuilt.path("attention") is not None or any(build_directory().glob("*.so"))


def compile_extension(name: str, cflags: list[str], directory: Path) -> ModuleType:
    """Compile (or load from `directory`) the kernels module `name` with `cflags`."""
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    return load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=cflags,
                extra_ldflags=["-fopenmp"], build_directory=str(directory))


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled kernels module, or None (disabled, or no working compiler)."""
    if not enabled():
        return None
    from frota.engine.kernels import prebuilt

    module = prebuilt.load("attention")
    if module is not None:
        return module
    try:
        return compile_extension("frota_cpu_kernels", list(CFLAGS), build_directory())
    except Exception as exc:  # no compiler, no headers, a failed build: fall back, loudly
        log.warning("C++ CPU kernels unavailable, using the PyTorch attention path: %s", exc)
        return None
