"""The wrapper around each adapted projection: the base projection's output (float, int8,
int4, packed for oneDNN or AMX: whatever it is) plus the LoRA delta of the step's rows.

Installed only when the engine has `max_loras > 0`. The wrappers of one model share one
`LoRAHolder`, which the model runner points at its slot pool and the step's `LoRABatch`
while the step runs (`applying`); with no adapter row in the step it stays None and the
wrapper costs one attribute read. Engines sharing one model each set their own pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from frota.engine.lora.batch import LoRABatch
from frota.engine.lora.ops import add_lora
from frota.engine.lora.slots import SlotPool


class LoRAHolder:
    """What the wrappers of one model read during a step: (pool, batch), or None."""

    def __init__(self) -> None:
        self.active: tuple[SlotPool, LoRABatch] | None = None


class LoRALinear(nn.Module):
    """`base(x)` plus the delta of slot projection `key` (local layer, projection name)."""

    def __init__(self, base: nn.Module, holder: LoRAHolder, key: tuple[int, str]) -> None:
        super().__init__()
        self.base = base
        self.holder = [holder]  # a list: not a submodule
        self.key = key

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        active = self.holder[0].active
        if active is None:
            return y
        pool, batch = active
        proj = pool.projections.get(self.key)
        return y if proj is None else add_lora(y, x, proj, batch)


def _wrap(owner: nn.Module, attr: str, holder: LoRAHolder, key: tuple[int, str]) -> None:
    """Wrap `owner.attr`; a row-parallel wrapper is entered, so the delta joins the partial
    product before its all-reduce (the sum is linear: it sums the partial deltas too)."""
    module = getattr(owner, attr)
    if hasattr(module, "comm") and hasattr(module, "inner"):  # parallel.layers.RowParallel
        module.inner = LoRALinear(module.inner, holder, key)
    else:
        setattr(owner, attr, LoRALinear(module, holder, key))


def install(model: nn.Module) -> LoRAHolder:
    """Wrap every adaptable projection of `model` once; its holder (the same on later calls)."""
    holder = getattr(model, "lora_holder", None)
    if holder is not None:
        return holder
    holder = LoRAHolder()
    for i, layer in enumerate(model.layers):
        _wrap(layer.self_attn, "qkv_proj", holder, (i, "qkv_proj"))
        _wrap(layer.self_attn, "o_proj", holder, (i, "o_proj"))
        if hasattr(layer.mlp, "gate_up_proj"):
            _wrap(layer.mlp, "gate_up_proj", holder, (i, "gate_up_proj"))
            _wrap(layer.mlp, "down_proj", holder, (i, "down_proj"))
    model.lora_holder = holder
    return holder


@contextmanager
def applying(model: nn.Module, pool: SlotPool | None, batch: LoRABatch | None) -> Iterator[None]:
    """Run the model's adapted projections with `batch`'s rows over `pool` (nothing if None)."""
    holder = getattr(model, "lora_holder", None)
    if holder is None or pool is None or batch is None:
        yield
        return
    holder.active = (pool, batch)
    try:
        yield
    finally:
        holder.active = None
