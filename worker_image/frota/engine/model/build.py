"""Construct a model without paying for random initialization."""

from __future__ import annotations

import torch
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
