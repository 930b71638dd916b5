"""`synthetic:` models: seeded random weights of any shape, dense or MoE, with a byte tokenizer.

Spec: `synthetic:PRESET[,key=value...]` or `synthetic:key=value,...` (preset dense-tiny),
parsed by `frota.api.synthetic` (which the planner shares). Presets: dense-tiny,
moe-tiny, dense-small, moe-small. Keys: layers, hidden, intermediate, heads, kv_heads,
head_dim, vocab, experts, top_k, max_len, rope_theta, tie, seed.
"""

from __future__ import annotations

import dataclasses

import torch

from frota.api.synthetic import SyntheticSpecError, parse_synthetic_spec, synthetic_shape
from frota.engine.config import ModelConfig
from frota.engine.errors import ModelNotFoundError
from frota.engine.model.build import build_model, cast_keeping_caches
from frota.engine.model.llama import LlamaForCausalLM
from frota.engine.progress import progress
from frota.engine.tokenizer import ByteTokenizer


def parse_spec(spec: str) -> tuple[ModelConfig, int]:
    """(config, seed) from the text after `synthetic:`."""
    try:
        values = parse_synthetic_spec(spec)
    except SyntheticSpecError as exc:
        raise ModelNotFoundError(f"synthetic model {spec!r}: {exc}") from None
    cfg = ModelConfig(
        **dataclasses.asdict(synthetic_shape(values)),
        rope_theta=float(values.get("rope_theta", 10000.0)),
        bos_token_id=ByteTokenizer.BOS,
        eos_token_ids=(ByteTokenizer.EOS,),
    )
    return cfg, int(values.get("seed", 0))


@torch.no_grad()
def load_synthetic(spec: str, dtype: torch.dtype, device: torch.device,
                   verbose: bool = True) -> tuple[LlamaForCausalLM, ModelConfig, ByteTokenizer]:
    """(model, config, tokenizer) with weights drawn from a generator seeded by the spec."""
    cfg, seed = parse_spec(spec)
    progress(verbose, f"building synthetic model {spec!r}")
    model = build_model(cfg, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
        elif name == "embed_tokens.weight":
            param.copy_(torch.randn(param.shape, generator=gen))
        else:
            param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5)
    model = cast_keeping_caches(model.to(device=device), dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model, cfg, ByteTokenizer(cfg.vocab_size)
