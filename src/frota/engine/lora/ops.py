"""The LoRA delta of one projection for a mixed batch: `y[t] += (x[t] @ A[s_t]) @ B[s_t]`.

Decode rows go by gather (punica's BGMV): every adapter of the step in one call. On the CPU
that is the C++ kernel `lora_ops.cpp` (in the attention kernels' module), which reads A and
B in place in the slot pool, four rows of one slot per weight read (bench/lora_ops.py: about
a tenth of the torch gather's time, which copies each row's A and B out first). Elsewhere,
or with `FROTA_CPU_KERNELS=0`, each row's A and B are gathered by its slot and one batched
matmul serves them all (torch ops; on CUDA untested until a GPU runs it). Prefill chunks go
by segment (SGMV): one matmul pair per chunk and target, whose rows share a slot. The kernel
and the segments read only each slot's own rank per target (the pool's columns past it are
zeros, and a target the adapter leaves out is skipped whole).
"""

from __future__ import annotations

from types import ModuleType

import torch

from frota.engine import kernels
from frota.engine.lora.batch import LoRABatch
from frota.engine.lora.slots import SlotProjection

# the dtypes the C++ kernel runs (activations and the slot pool share the model's)
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def gather_kernel(x: torch.Tensor, proj: SlotProjection) -> ModuleType | None:
    """The C++ gather kernel when it runs these tensors (CPU, its dtypes), else None."""
    if x.device.type != "cpu" or x.dtype not in _KERNEL_DTYPES or proj.a.dtype != x.dtype:
        return None
    return kernels.cpu_kernels()


def add_lora(y: torch.Tensor, x: torch.Tensor, proj: SlotProjection, batch: LoRABatch) -> torch.Tensor:
    """`y` (the base projection of `x`, [T, out]) plus each listed row's delta, in place."""
    r = proj.max_rank
    if batch.decode_rows is not None and (kernel := gather_kernel(x, proj)) is not None \
            and y.dtype == x.dtype and y.stride(-1) == 1 and x.stride(-1) == 1:
        kernel.lora_gather(y, x, proj.a, proj.b, proj.offsets, proj.ranks, batch.decode_rows,
                           batch.decode_slots)
    elif batch.decode_rows is not None:
        rows, slots = batch.decode_rows, batch.decode_slots
        xa = torch.bmm(x.index_select(0, rows).unsqueeze(1), proj.a.index_select(0, slots))
        for j, (offset, b) in enumerate(zip(proj.offsets, proj.b, strict=True)):
            delta = torch.bmm(xa[:, :, j * r : (j + 1) * r], b.index_select(0, slots)).squeeze(1)
            y[:, offset : offset + b.shape[2]].index_add_(0, rows, delta.to(y.dtype))
    for start, end, slot in batch.segments:
        for j, (offset, b) in enumerate(zip(proj.offsets, proj.b, strict=True)):
            rank = proj.slot_ranks[slot][j]
            if rank:
                xa = x[start:end] @ proj.a[slot, :, j * r : j * r + rank]
                y[start:end, offset : offset + b.shape[2]] += (xa @ b[slot, :rank]).to(y.dtype)
    return y
