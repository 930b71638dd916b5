"""Frota's C++ kernels for the CPU, each a .cpp file here, built by `build.py` and cached.

PyTorch has no paged attention for the CPU: expressed with its ops, decode
attention must gather every block of every sequence into a new tensor before
it can multiply, which copies the whole KV context once per layer per step.
`paged_attention.cpp` reads the pool in place instead. `layer_ops.cpp` fuses
the chains of small ops around the matmuls (RMSNorm with its residual add,
RoPE with the KV cache write, SiLU-and-multiply): at decode batch sizes their
dispatch overhead is most of a step's time outside the matmuls.
`decode_stack.cpp` runs a whole int4 Llama stack for a small decode step in one
call (`frota.engine.model.decode_stack`). These files are one extension,
`cpu_kernels()`. `quant_ops.cpp`, the int8/int4 matmuls of quantized layers, is
the other (`frota.engine.quant.cpu_kernels`); `kernels.h` declares what one file
calls in another.

Both are compiled with the system C++ compiler the first time an engine needs
them (a minute or two, once per machine and torch version; `python -m
frota.engine.kernels` does it ahead of time; the result is cached under
`build.cache_root()`), for the machine they run on (`-march=native`).

The worker image carries them prebuilt instead, for portable ISA levels
(`isa.py`, `prebuilt.py`): with `FROTA_KERNELS_DIR` set, the best level this CPU
runs is loaded and nothing is compiled.

Without a compiler, or with `FROTA_CPU_KERNELS=0`, `cpu_kernels()` returns
None and the engine uses its PyTorch paths, which compute the same thing.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from frota.engine.kernels import build, isa

if TYPE_CHECKING:
    import torch


def enabled() -> bool:
    return build.enabled("attention")


def cpu_kernels() -> ModuleType | None:
    """The attention and layer-ops module, or None (switched off, or no working compiler)."""
    return build.load("attention")


def for_tensor(t: torch.Tensor) -> ModuleType | None:
    """The kernels module when `t` is on the CPU and the kernels are available."""
    return cpu_kernels() if t.device.type == "cpu" else None


def is_built() -> bool:
    """Whether `cpu_kernels()` will load a prebuilt or cached build rather than compile."""
    return build.is_built("attention")


def describe() -> str:
    """Which attention kernels run, for the engine's start-up line."""
    module = cpu_kernels()
    if module is None:
        return "PyTorch attention (no C++ kernels)"
    level = next((lv.name for lv in isa.LEVELS if module.__name__.endswith("_" + lv.slug)), None)
    return f"C++ kernels prebuilt for {level}" if level else "C++ kernels built for this CPU"
