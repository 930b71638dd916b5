"""The LoRA delta of one projection for a mixed batch: `y[t] += (x[t] @ A[s_t]) @ B[s_t]`.

Decode rows go by gather (punica's BGMV): each row's A and B are gathered by its slot and
one batched matmul serves every adapter of the step at once. Prefill chunks go by segment
(SGMV): one matmul pair per chunk, whose rows share a slot. Plain torch ops, so the same code
runs on the CPU and on CUDA (CUDA: untested until a GPU runs it).
"""

from __future__ import annotations

import torch

from frota.engine.lora.batch import LoRABatch
from frota.engine.lora.slots import SlotProjection


def add_lora(y: torch.Tensor, x: torch.Tensor, proj: SlotProjection, batch: LoRABatch) -> torch.Tensor:
    """`y` (the base projection of `x`, [T, out]) plus each listed row's delta, in place."""
    r = proj.max_rank
    if batch.decode_rows is not None:
        rows, slots = batch.decode_rows, batch.decode_slots
        xa = torch.bmm(x.index_select(0, rows).unsqueeze(1), proj.a.index_select(0, slots))
        for j, (offset, b) in enumerate(zip(proj.offsets, proj.b, strict=True)):
            delta = torch.bmm(xa[:, :, j * r : (j + 1) * r], b.index_select(0, slots)).squeeze(1)
            y[:, offset : offset + b.shape[2]].index_add_(0, rows, delta.to(y.dtype))
    for start, end, slot in batch.segments:
        xa = x[start:end] @ proj.a[slot]
        for j, (offset, b) in enumerate(zip(proj.offsets, proj.b, strict=True)):
            y[start:end, offset : offset + b.shape[2]] += (xa[:, j * r : (j + 1) * r] @ b[slot]).to(y.dtype)
    return y
