"""The fused decode path: every layer of a Llama model for one decode step in a single C++ call.

At decode batch sizes a layer's ten kernels do little arithmetic each, and the Python
around them (module calls, checks, views) cost a quarter of a batch-1 int4 step on a
2-core machine. `kernels/decode_stack.cpp` runs the same kernels in the same order from
C++, so its output is the Python layers' bit for bit.

It applies where the Python layers would run exactly those kernels: a plain Llama stack on
the CPU with the C++ kernels loaded, every projection int4 in Frota's kernel layout, no
biases, the norms and KV caches in the activations' dtype, and steps that only decode, at
most `GEMV_MAX_ROWS` sequences. Anything else (tensor parallel shards, MoE, bf16 or int8
weights, a quantized KV pool, prefill) keeps the Python layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from frota.engine import kernels
from frota.engine.quant import cpu_kernels
from frota.engine.quant.linear import FROTA_DTYPES, GEMV_MAX_ROWS, Int4Linear

if TYPE_CHECKING:
    from frota.engine.attention import AttentionMetadata
    from frota.engine.model.llama import LlamaForCausalLM

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def applies(x: torch.Tensor, meta: AttentionMetadata) -> bool:
    """Whether this step (embeddings `x`) is one the stack runs: decodes only, few of them."""
    return meta.num_decodes == x.shape[0] <= GEMV_MAX_ROWS and x.device.type == "cpu"


def build(model: LlamaForCausalLM, kv_caches: KVCaches, dtype: torch.dtype) -> Any | None:
    """The C++ stack over `model`'s layers and `kv_caches`, or None where it does not apply."""
    from frota.engine.model.layers import RMSNorm
    from frota.engine.model.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP

    ops, quant = kernels.cpu_kernels(), cpu_kernels.kernels()
    rotary = model.layers[0].self_attn.rotary if len(model.layers) else None
    if ops is None or quant is None or rotary is None or rotary.cos.dtype != torch.float32 \
            or dtype not in FROTA_DTYPES:
        return None
    tensors: list[list[torch.Tensor]] = []
    groups: list[list[int]] = []
    eps = {model.cfg.rms_norm_eps}
    for layer, (k_cache, v_cache) in zip(model.layers, kv_caches, strict=True):
        if type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention \
                or type(layer.mlp) is not LlamaMLP:
            return None
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not all(type(p) is Int4Linear and p.qs is not None and p.bias is None for p in projections):
            return None
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(type(n) is RMSNorm and n.weight.dtype == dtype for n in norms):
            return None
        if not all(type(c) is torch.Tensor and c.dtype == dtype and c.is_contiguous() for c in (k_cache, v_cache)):
            return None
        eps.update(n.eps for n in norms)
        tensors.append([norms[0].weight.detach(), norms[1].weight.detach(), k_cache, v_cache,
                        *(t for p in projections for t in (p.qs, p.d, p.m))])
        groups.append([p.group_size for p in projections])
    if len(eps) != 1 or not tensors:
        return None
    first = model.layers[0].self_attn
    return ops.DecodeStack(quant.int4_mm_capsule, tensors, groups, rotary.cos, rotary.sin,
                           first.num_heads, first.num_kv_heads, first.head_dim, eps.pop(), first.scale)
