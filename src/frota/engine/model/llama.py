"""The Llama family over a flat token stream: RMSNorm, RoPE, grouped-query attention,
SwiGLU (or a Mixtral-style mixture of experts), tied or untied embeddings.

Weights are named as in HF checkpoints; q/k/v and gate/up are fused at load time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from frota.engine import kernels
from frota.engine.attention import AttentionMetadata, paged_attention, paged_kernels
from frota.engine.config import ModelConfig
from frota.engine.model import decode_stack
from frota.engine.model.layers import RMSNorm, RotaryEmbedding, make_linear
from frota.engine.model.moe import MixtureOfExperts


class LlamaAttention(nn.Module):
    """Self-attention reading and writing the paged KV cache."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = make_linear(cfg.hidden_size, self.q_size + 2 * self.kv_size)
        self.o_proj = make_linear(self.q_size, cfg.hidden_size)
        self.rotary = rotary

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        k_cache, v_cache = kv_cache
        ops = paged_kernels(qkv, k_cache, v_cache)
        fused = ops is not None and self.rotary.cos.dtype == torch.float32
        if fused:  # RoPE in place and the K/V cache write, in one pass
            ops.rope_and_cache(qkv, positions, self.rotary.cos, self.rotary.sin, k_cache, v_cache,
                               meta.slot_blocks, meta.slot_offsets, self.num_heads, self.num_kv_heads)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if not fused:
            q, k = self.rotary(positions, q, k)
        o = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, kv_written=fused)
        return self.o_proj(o.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = make_linear(hidden_size, 2 * intermediate_size)
        self.down_proj = make_linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        ops = kernels.for_tensor(gate_up)
        if ops:
            return self.down_proj(ops.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.is_moe:
            self.mlp: nn.Module = MixtureOfExperts(cfg)
        else:
            self.mlp = LlamaMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """May overwrite `x` (the fused residual add); returns the layer's output."""
        h = self.self_attn(positions, self.input_layernorm(x), kv_cache, meta)
        h, x = self.post_attention_layernorm(h, residual=x)
        return x + self.mlp(h)


class LlamaForCausalLM(nn.Module):
    """Token ids in, hidden states out; `compute_logits` only for the rows that sample."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, rotary) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = make_linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.lora_holder = None  # frota.engine.lora.layers.LoRAHolder once adapters are installed
        self.fused_decode = True  # run decode-only steps through decode_stack where it applies
        self._decode_stack: tuple[list, decode_stack.DecodeStack | None] | None = None  # (caches, stack)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        stack = self._stack_for(kv_caches, x.dtype)
        # rows under LoRA adapters: the slot pool and the step's rows (frota.engine.lora.layers)
        lora = self.lora_holder.active if self.lora_holder is not None else None
        if stack is not None and stack.applies(x, meta, lora):
            x = stack.run(x, positions, meta, lora)
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                x = layer(positions, x, kv_cache, meta)
        return self.norm(x)

    def _stack_for(self, kv_caches, dtype: torch.dtype) -> decode_stack.DecodeStack | None:
        """The fused decode stack over these caches (built once), or None where it does not apply."""
        if not self.fused_decode:
            return None
        if self._decode_stack is None or self._decode_stack[0] is not kv_caches:
            self._decode_stack = (kv_caches, decode_stack.build(self, kv_caches, dtype))
        return self._decode_stack[1]

    def plain_layers(self) -> list[nn.Module] | None:
        """The decoder layers when every one is exactly a Llama layer with a dense MLP (no
        subclass: a shard or a mixture of experts computes something else), else None."""
        layers = list(self.layers)
        plain = all(type(layer) is LlamaDecoderLayer and type(layer.self_attn) is LlamaAttention
                    and type(layer.mlp) is LlamaMLP for layer in layers)
        return layers if plain else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors, fusing q/k/v and gate/up; fails on missing or unknown names."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        pending: dict[str, dict[int, int]] = {}
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.cfg.tie_word_embeddings):
                continue
            expert = _EXPERT.fullmatch(name)
            if expert:
                layer, index, which = int(expert[1]), int(expert[2]), expert[3]
                loaded.update(self.layers[layer].mlp.load_expert(index, which, tensor, layer))
                continue
            name = name.replace(".block_sparse_moe.gate.", ".mlp.gate.")
            pieces = name.split(".")
            if len(pieces) >= 2 and pieces[-2] in _FUSED:
                # Copy straight into the fused matrix's rows (no concatenation).
                target, index, count = _FUSED[pieces[-2]]
                name = ".".join([*pieces[:-2], target, pieces[-1]])
                rows = params[name].shape[0] // count if target == "gate_up_proj" else None
                offset = self._fused_offset(target, index) if rows is None else index * rows
                params[name][offset : offset + tensor.shape[0]].copy_(tensor)
                group = pending.setdefault(name, {})
                group[index] = tensor.shape[0]
                if len(group) == count:
                    del pending[name]
                    loaded.add(name)
                continue
            if name not in params:
                raise KeyError(f"unexpected weight {name!r} in the checkpoint")
            if params[name].shape != tensor.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)}, model expects "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(tensor)  # converts the dtype in the one copy
            loaded.add(name)
        if self.cfg.tie_word_embeddings:
            loaded.add("lm_head.weight")
        missing = (set(params) - loaded) | set(pending)
        if missing:
            raise KeyError(f"weights missing from the checkpoint: {sorted(missing)[:8]}")


    def _fused_offset(self, target: str, index: int) -> int:
        q_size = self.cfg.num_heads * self.cfg.head_dim
        kv_size = self.cfg.num_kv_heads * self.cfg.head_dim
        return (0, q_size, q_size + kv_size)[index]


_FUSED = {
    "q_proj": ("qkv_proj", 0, 3), "k_proj": ("qkv_proj", 1, 3), "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2), "up_proj": ("gate_up_proj", 1, 2),
}
_EXPERT = re.compile(r"layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3)\.weight")
