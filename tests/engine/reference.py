"""A naive, unpaged forward pass over the engine's own weights: the reference for the paged path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from frota.engine.model.llama import LlamaForCausalLM


@torch.inference_mode()
def reference_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Logits [n, vocab] for one sequence: dense causal attention, MoE token by token."""
    cfg = model.cfg
    n = len(ids)
    x = model.embed_tokens(torch.tensor(ids))
    pos = torch.arange(n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    g = cfg.num_heads // cfg.num_kv_heads
    for layer in model.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = q.view(n, cfg.num_heads, cfg.head_dim)
        k = k.view(n, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim).repeat_interleave(g, dim=1)
        q, k = attn.rotary(pos, q, k)
        k = k.repeat_interleave(g, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * attn.scale
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", probs, v.float()).to(x.dtype)
        x = x + attn.o_proj(out.reshape(n, -1))
        h = layer.post_attention_layernorm(x)
        x = x + (_naive_moe(layer.mlp, h) if cfg.is_moe else layer.mlp(h))
    return model.compute_logits(model.norm(x))


def _naive_moe(moe, h: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(h)
    ff = moe.intermediate_size
    for t in range(h.shape[0]):
        router = F.softmax(moe.gate(h[t]).float(), dim=-1)
        weights, experts = router.topk(moe.top_k)
        weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), experts.tolist(), strict=True):
            gate = moe.w13[e, :ff] @ h[t]
            up = moe.w13[e, ff:] @ h[t]
            out[t] += w * (moe.w2[e] @ (F.silu(gate) * up))
    return out


def reference_greedy(model: LlamaForCausalLM, ids: list[int], num_tokens: int) -> list[int]:
    ids = list(ids)
    out = []
    for _ in range(num_tokens):
        token = int(reference_logits(model, ids)[-1].argmax())
        out.append(token)
        ids.append(token)
    return out
