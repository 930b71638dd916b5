"""CPU int8 / int4 weight-only matmuls for a few rows (decode): Frota's C++ extension
`frota/engine/kernels/quant_ops.cpp` (its shapes and layouts are written there).

Batch-1 decode reads every weight once per token, so its speed is the bytes a
kernel reads and how close it gets to the memory bandwidth. torch's CPU kernels
do not get there for these formats: `_weight_int8pack_mm` reads int8 slower
than oneDNN reads bfloat16, its float32 path and `_weight_int4pack_mm_for_cpu`'s
are scalar loops, and nothing takes int8 group scales (GGUF Q8_0, e.g. a tied
LM head) in one call. The extension does, for activations of any float dtype:
`int8_mm`, `int4_mm` (GGUF Q4_1's nibble order and float16 d, m exactly), and
`int8_dequant`, `int4_dequant` for many rows (prefill), where a dequantized GEMM wins.

It is built, cached, prebuilt per ISA level and switched off like every Frota C++
kernel (`frota.engine.kernels.build`): `FROTA_CPU_KERNELS=0` turns them all off,
`FROTA_QUANT_KERNELS=torch` these alone. Then, or without a compiler (logged once),
`kernels()` returns None and the layers use torch's own ops.
"""

from __future__ import annotations

from types import ModuleType

from frota.engine.kernels import build


def kernels() -> ModuleType | None:
    """The compiled extension, or None (switched off, or no working compiler)."""
    return build.load("quant")
