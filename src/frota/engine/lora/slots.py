"""The fixed pool of adapter slots, allocated once at start-up like the KV cache.

Per layer and per adapted projection of the model (the fused `qkv_proj` and `gate_up_proj`,
`o_proj`, `down_proj`), one `SlotProjection`: A stacked over slots `[slots, in, k * R]` (the
`k` PEFT targets fused into the projection side by side along the rank) and, per target, B
`[slots, R, width]` writing the target's column range of the projection's output. Ranks
below `R` (`max_lora_rank`) are zero-padded; a target an adapter leaves out is all zeros.
That is exactly `frota.api.memory.lora_slot_bytes` per slot.

A slot is free, pinned (sequences run under its adapter) or idle (resident, unpinned).
Eviction takes the least recently idle slot; a pinned slot is never written. The host copy
stays with the `LoadedAdapter`, so evicting is forgetting the slot.

Under tensor parallelism each rank holds its shard (`ShardRanges`): a column-parallel
projection keeps A whole and B's output columns of its heads / its MLP slice; a row-parallel
one (o, down) keeps A's input rows of its slice and B whole, so the partial delta is summed
by the projection's own all-reduce.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from frota.api.memory import LORA_ROW_PARALLEL
from frota.engine.lora.adapter import LoadedAdapter

# the model's projections and the PEFT targets fused into each, in column order
FUSED_TARGETS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


@dataclass(frozen=True)
class ShardRanges:
    """(start, length) of this rank's slice of the full q, k/v and MLP widths (the whole
    widths without tensor parallelism)."""

    q: tuple[int, int]
    kv: tuple[int, int]
    ff: tuple[int, int]

    def of(self, target: str) -> tuple[int, int]:
        if target in ("q_proj", "o_proj"):
            return self.q
        if target in ("k_proj", "v_proj"):
            return self.kv
        return self.ff


class SlotProjection:
    """The slots of one adapted projection of one layer."""

    def __init__(self, name: str, in_features: int, widths: list[int], num_slots: int,
                 max_rank: int, dtype: torch.dtype, device: torch.device) -> None:
        self.name = name
        self.targets = FUSED_TARGETS[name]
        self.max_rank = max_rank
        self.a = torch.zeros(num_slots, in_features, len(widths) * max_rank, dtype=dtype, device=device)
        self.b = [torch.zeros(num_slots, max_rank, w, dtype=dtype, device=device) for w in widths]
        self.offsets = [sum(widths[:i]) for i in range(len(widths))]
        # Each slot's rank per target, 0 where its adapter leaves the target out: the
        # columns past it are zeros, and the C++ kernel and the prefill segments skip them.
        # Host-side bookkeeping (the kernel reads it on the CPU), not adapter weights.
        self.ranks = torch.zeros(num_slots, len(widths), dtype=torch.long)
        self.slot_ranks: list[list[int]] = [[0] * len(widths) for _ in range(num_slots)]

    def nbytes(self) -> int:
        """The adapter weights' bytes (A and every B): what the memory plan reserves."""
        return sum(t.numel() * t.element_size() for t in (self.a, *self.b))

    def set_rank(self, slot: int, target: int, rank: int) -> None:
        self.ranks[slot, target] = rank
        self.slot_ranks[slot][target] = rank


class SlotPool:
    """`num_slots` slots over the projections of `layers` (global layer indices)."""

    def __init__(self, projections: dict[tuple[int, str], SlotProjection], layers: range,
                 num_slots: int, shard: ShardRanges) -> None:
        self.projections = projections  # (local layer index, projection name) -> its slots
        self.layers = layers
        self.num_slots = num_slots
        self.shard = shard
        self.owners: list[LoadedAdapter | None] = [None] * num_slots
        self.free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() takes slot 0 first
        self.idle: OrderedDict[int, None] = OrderedDict()  # front: the least recently used
        self.num_evictions = 0

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.projections.values())

    # -- pins ---------------------------------------------------------------------------

    def acquire(self, adapter: LoadedAdapter) -> int | None:
        """Pin `adapter` in a slot (loading it into a free one, or the LRU idle one's); the
        slot written, or None when it was already resident; raises `SlotsBusy` when every
        slot is pinned by another adapter."""
        if adapter.slot is not None:
            if adapter.num_pins == 0:
                del self.idle[adapter.slot]
            adapter.num_pins += 1
            return None
        if self.free:
            slot = self.free.pop()
        elif self.idle:
            slot, _ = self.idle.popitem(last=False)
            evicted = self.owners[slot]
            if evicted is not None:
                evicted.slot = None
            self.num_evictions += 1
        else:
            raise SlotsBusy
        self.write(slot, adapter)
        self.owners[slot] = adapter
        adapter.slot = slot
        adapter.num_pins = 1
        return slot

    def release(self, adapter: LoadedAdapter) -> None:
        """Unpin once; an unpinned slot turns idle (or free, once its adapter is unloaded)."""
        adapter.num_pins -= 1
        if adapter.num_pins == 0 and adapter.slot is not None:
            if adapter.is_unloaded:
                self.forget(adapter)
            else:
                self.idle[adapter.slot] = None

    def forget(self, adapter: LoadedAdapter) -> None:
        """Free an unpinned adapter's slot (an unload)."""
        slot = adapter.slot
        if slot is None or adapter.num_pins:
            return
        self.idle.pop(slot, None)
        self.owners[slot] = None
        adapter.slot = None
        self.free.append(slot)

    # -- weights ------------------------------------------------------------------------

    @torch.no_grad()
    def write(self, slot: int, adapter: LoadedAdapter) -> None:
        """Copy this rank's shard of `adapter`'s weights into `slot`, zeros where it has none."""
        for (layer, name), proj in self.projections.items():
            proj.a[slot].zero_()
            r_max = proj.max_rank
            row_parallel = name in LORA_ROW_PARALLEL
            for j, target in enumerate(proj.targets):
                proj.b[j][slot].zero_()
                proj.set_rank(slot, j, 0)
                pair = adapter.weights.get((self.layers[layer], target))
                if pair is None:
                    continue
                a, b = pair
                start, length = self.shard.of(target)
                if row_parallel:  # this rank's input rows of A; B whole
                    a = a[start : start + length]
                else:  # A whole; this rank's output columns of B
                    b = b[:, start : start + length]
                r = a.shape[1]
                proj.a[slot, :, j * r_max : j * r_max + r].copy_(a)
                proj.b[j][slot, :r].copy_(b)
                proj.set_rank(slot, j, r)


class SlotsBusy(Exception):
    """Every slot is pinned by a running sequence: the request waits for one to idle."""


def build_pool(model: torch.nn.Module, num_slots: int, max_rank: int, layers: range,
               shard: ShardRanges, dtype: torch.dtype, device: torch.device) -> SlotPool:
    """Slots for every adaptable projection of `model`'s decoder layers (a mixture of experts'
    feed-forward is not adaptable, as in `frota.api.memory.lora_module_shapes`)."""
    projections: dict[tuple[int, str], SlotProjection] = {}
    q, kv, ff = shard.q[1], shard.kv[1], shard.ff[1]
    for i, layer in enumerate(model.layers):
        hidden = layer.input_layernorm.weight.shape[0]
        projections[(i, "qkv_proj")] = SlotProjection("qkv_proj", hidden, [q, kv, kv], num_slots,
                                                      max_rank, dtype, device)
        projections[(i, "o_proj")] = SlotProjection("o_proj", q, [hidden], num_slots, max_rank,
                                                    dtype, device)
        if hasattr(layer.mlp, "gate_up_proj"):
            projections[(i, "gate_up_proj")] = SlotProjection(
                "gate_up_proj", hidden, [ff, ff], num_slots, max_rank, dtype, device)
            projections[(i, "down_proj")] = SlotProjection("down_proj", ff, [hidden], num_slots,
                                                           max_rank, dtype, device)
    return SlotPool(projections, layers, num_slots, shard)
