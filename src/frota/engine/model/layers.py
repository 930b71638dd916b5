"""Building blocks shared by the models. Linear layers are made in one place (`make_linear`)
so quantized or sharded variants can slot in later."""

from __future__ import annotations

import torch
from torch import nn

from frota.engine import kernels


def make_linear(in_features: int, out_features: int, bias: bool = False) -> nn.Module:
    """The one constructor for every projection in the model."""
    return nn.Linear(in_features, out_features, bias=bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like the reference implementation."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`norm(x)`; with `residual`, `(norm(residual + x), residual + x)`, where the fused CPU
        kernel adds into `residual` in place."""
        plain = x.dtype == self.weight.dtype and x.dim() == 2 and x.is_contiguous() and (
            residual is None or residual.is_contiguous())
        ops = kernels.for_tensor(x) if plain else None
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps) if ops else self._norm(x)
        if ops:
            return ops.add_rms_norm(x, residual, self.weight, self.eps), residual
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the rotate-half layout (HF Llama's)."""

    def __init__(self, head_dim: int, max_position: int, base: float) -> None:
        super().__init__()
        # Explicit device: built under torch.device("meta"), these must still be real numbers.
        cpu = torch.device("cpu")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=cpu).float() / head_dim))
        t = torch.arange(max_position, dtype=torch.float32, device=cpu)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, H, D], k: [T, KVH, D]; positions: [T]."""
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
