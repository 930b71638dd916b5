"""Mixtral-style sparse feed-forward: a top-k router over SwiGLU experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from frota.engine.config import ModelConfig
from frota.engine.model.layers import make_linear


class MixtureOfExperts(nn.Module):
    """Each token goes to its top-k experts; their outputs are mixed by renormalized router weights.

    Expert weights are stacked: `w13[e]` is expert e's fused gate/up projection, `w2[e]` its down.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.intermediate_size = cfg.intermediate_size
        self.gate = make_linear(cfg.hidden_size, cfg.num_experts)
        self.w13 = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.intermediate_size, cfg.hidden_size))
        self.w2 = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size))
        self._num_loaded = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = router.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        # Group the (token, slot) pairs by expert with one sort instead of a mask per expert.
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = order[start : start + n]
            tok = tokens[start : start + n]
            start += n
            y = self.expert(e, x[tok])
            out.index_add_(0, tok, y * weights.flatten()[idx].unsqueeze(-1))
        return out

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's SwiGLU on its tokens (quantization swaps in its own linears here)."""
        gate, up = F.linear(x, self.w13[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.w2[e])

    @torch.no_grad()
    def load_expert(self, index: int, which: str, tensor: torch.Tensor, layer: int) -> list[str]:
        """Copy one HF-named expert matrix (w1 gate, w3 up, w2 down); once all are in, name the params."""
        ff = self.intermediate_size
        if which == "w1":
            self.w13[index, :ff].copy_(tensor)
        elif which == "w3":
            self.w13[index, ff:].copy_(tensor)
        else:
            self.w2[index].copy_(tensor)
        self._num_loaded += 1
        if self._num_loaded < 3 * self.num_experts:
            return []
        return [f"layers.{layer}.mlp.w13", f"layers.{layer}.mlp.w2"]
