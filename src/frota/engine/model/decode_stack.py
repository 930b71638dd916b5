"""The fused decode path: every layer of a Llama model for one decode step in a single C++ call.

At decode batch sizes a layer's ten kernels do little arithmetic each, and the Python
around them (module calls, checks, views) cost 43% of a batch-1 int4 step on a 2-core
machine. `kernels/decode_stack.cpp` runs the same kernels in the same order from
C++, so its output is the Python layers' bit for bit.

It applies where the Python layers would run exactly those kernels: a plain Llama stack on
the CPU with the C++ kernels loaded; every projection without a bias and either int4 in
Frota's kernel layout, on AMX tiles (`AmxLinear`), packed for oneDNN (`PackedLinear`) or a
plain `nn.Linear`; the norms
and KV caches in the activations' dtype; and steps that only decode. With int4 weights a
step may decode at most `GEMV_MAX_ROWS` sequences (the rows Frota's int4 kernel takes; the
Python layers dequantize past that); with float weights, any number (a bf16 decode step of
64 sequences of SmolLM2-135M: 96.8 ms through the stack, 107.8 ms through the Python layers,
docs/engine.md#cpu-kernels).
Anything else (tensor parallel shards, MoE, int8 or fp8 weights, a quantized KV pool, a
step with a prefill chunk) keeps the Python layers.

Decode rows under LoRA adapters run here too, each projection followed by the C++ gather
kernel over the engine's slot pool (the call `LoRALinear` makes, so again bit for bit), where
that kernel takes the pool (`frota.engine.lora.ops.gather_kernel`). Keeping adapter steps
in the stack is what holds a mix of four adapters near the base model's speed
(docs/adapters.md#performance).
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import torch
from torch import nn

from frota.engine import kernels
from frota.engine.attention import AttentionMetadata
from frota.engine.config import ModelConfig
from frota.engine.kernels.linear import AmxLinear, PackedLinear
from frota.engine.lora.batch import LoRABatch
from frota.engine.lora.layers import LoRALinear
from frota.engine.lora.ops import gather_kernel
from frota.engine.lora.slots import SlotPool
from frota.engine.model.layers import RMSNorm, RotaryEmbedding
from frota.engine.quant import cpu_kernels
from frota.engine.quant.linear import FROTA_DTYPES, GEMV_MAX_ROWS, Int4Linear

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]
# a layer's projections in the order decode_stack.cpp takes them, as the slot pool names them
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class DecodeStack:
    """The C++ stack over a model's layers and KV caches, and the steps it takes."""

    def __init__(self, stack: Any, max_rows: int) -> None:
        self.stack = stack
        self.max_rows = max_rows  # the most sequences a step it runs may decode
        self._slots: tuple[SlotPool, Any] | None = None  # the last pool, as decode_stack.cpp takes it

    def applies(self, x: torch.Tensor, meta: AttentionMetadata,
                lora: tuple[SlotPool, LoRABatch] | None = None) -> bool:
        """Whether the step with embeddings `x` (and adapter rows `lora`) is one it runs: only
        decodes, few enough, and adapter slots the gather kernel reads."""
        if not meta.num_decodes == x.shape[0] <= self.max_rows:
            return False
        if lora is None:
            return True
        pool, batch = lora
        return batch.decode_rows is not None and not batch.segments \
            and self._adapter_slots(pool, x) is not None

    def run(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            lora: tuple[SlotPool, LoRABatch] | None = None) -> torch.Tensor:
        """The last layer's output for the step (`x` is overwritten)."""
        if lora is None:
            return self.stack.run(x, positions, meta.slot_blocks, meta.slot_offsets,
                                  meta.decode_block_tables, meta.decode_context_lens)
        pool, batch = lora
        return self.stack.run(x, positions, meta.slot_blocks, meta.slot_offsets,
                              meta.decode_block_tables, meta.decode_context_lens,
                              self._adapter_slots(pool, x), batch.decode_rows, batch.decode_slots)

    def _adapter_slots(self, pool: SlotPool, x: torch.Tensor) -> Any:
        """`pool` as decode_stack.cpp's AdapterSlots, or None where the gather kernel does not
        take its slots with activations like `x`. Built again only for another pool: a pool's
        tensors are written in place as adapters load."""
        if self._slots is None or self._slots[0] is not pool:
            ops = kernels.cpu_kernels()
            takes = ops is not None and all(gather_kernel(x, p) is not None for p in pool.projections.values())
            layers = [[None if (p := pool.projections.get((i, name))) is None
                       else (p.a, p.b, p.offsets, p.ranks) for name in PROJECTIONS]
                      for i in range(len(self))]
            self._slots = (pool, ops.AdapterSlots(layers) if takes else None)
        return self._slots[1]

    def __len__(self) -> int:
        return len(self.stack)


def projection(linear: nn.Module) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """(kind, weight, d, m, size) for decode_stack.cpp, or None for a layer it cannot run. `size`
    is int4's group size, or an AMX layer's out_features."""
    none = torch.empty(0)
    if type(linear) is LoRALinear:  # the stack adds the adapter rows' delta itself
        linear = linear.base
    if type(linear) is Int4Linear and linear.qs is not None and linear.bias is None:
        return "int4", linear.qs, linear.d, linear.m, linear.group_size
    if type(linear) is AmxLinear and linear.bias is None:
        return "amx", linear.packed, none, none, linear.out_features
    if type(linear) is PackedLinear and linear.bias is None:
        return "packed", linear.packed, none, none, 0
    if type(linear) is nn.Linear and linear.bias is None:
        return "dense", linear.weight.detach(), none, none, 0
    return None


class StackableModel(Protocol):
    """What `build` reads of a model (`LlamaForCausalLM`)."""

    cfg: ModelConfig

    def plain_layers(self) -> list[nn.Module] | None: ...


def build(model: StackableModel, kv_caches: KVCaches, dtype: torch.dtype) -> DecodeStack | None:
    """The stack over `model`'s layers and `kv_caches`, or None where it does not apply."""
    layers = model.plain_layers()  # None: a layer that is not exactly a Llama one (MoE, a shard)
    rotary: RotaryEmbedding | None = layers[0].self_attn.rotary if layers else None
    ops = kernels.cpu_kernels()
    if ops is None or not layers or rotary is None or rotary.cos.dtype != torch.float32 \
            or dtype not in FROTA_DTYPES:
        return None
    tensors: list[list[torch.Tensor]] = []
    projections: list[list[tuple]] = []
    eps = {model.cfg.rms_norm_eps}
    for layer, (k_cache, v_cache) in zip(layers, kv_caches, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        projs = [projection(p) for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if None in projs or not all(type(n) is RMSNorm and n.weight.dtype == dtype for n in norms):
            return None
        caches = (k_cache, v_cache)
        if not all(type(c) is torch.Tensor and c.dtype == dtype and c.is_contiguous() for c in caches):
            return None
        eps.update(n.eps for n in norms)
        tensors.append([norms[0].weight.detach(), norms[1].weight.detach(), k_cache, v_cache])
        projections.append(projs)
    int4 = any(p[0] == "int4" for layer_projs in projections for p in layer_projs)
    quant = cpu_kernels.kernels() if int4 else None
    if len(eps) != 1 or (int4 and quant is None):
        return None
    first = layers[0].self_attn
    stack = ops.DecodeStack(quant.int4_mm_capsule if quant else None, tensors, projections,
                            rotary.cos, rotary.sin, first.num_heads, first.num_kv_heads,
                            first.head_dim, eps.pop(), first.scale)
    return DecodeStack(stack, GEMV_MAX_ROWS if int4 else sys.maxsize)
