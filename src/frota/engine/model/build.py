"""Construct a model without paying for random initialization."""

from __future__ import annotations

import torch
from torch import nn

from frota.engine.config import ModelConfig
from frota.engine.model.layers import RotaryEmbedding
from frota.engine.model.llama import LlamaForCausalLM


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """An uninitialized model in `dtype` on `device`; the caller loads its weights."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta).to(device)
    for layer in model.layers:
        layer.self_attn.rotary = rotary
    model.eval()
    return model


def cast_keeping_caches(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model.to(dtype)`, except float caches that are not weights (non-persistent buffers:
    the rotary cos/sin tables) stay as built, as a model loaded straight in `dtype` keeps
    them: the same RoPE numerics as the float model, and the engine's fused RoPE + KV-write
    kernel takes only float32 tables."""
    keep = []
    for module in model.modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buf = module._buffers.get(name)
            if buf is not None and buf.is_floating_point():
                keep.append((module, name, buf))
    model.to(dtype)
    for module, name, buf in keep:
        module._buffers[name] = buf
    return model
