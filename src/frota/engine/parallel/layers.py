"""Tensor-parallel pieces that wrap the engine's own modules (so quantized or faster kernels
inside them keep working): a row-parallel output projection, a vocab-parallel embedding and
LM head, and an expert-parallel mixture of experts.

Column-parallel projections (fused q/k/v, fused gate/up) need no wrapper: a rank's shard is
a plain linear with fewer output rows, and its output feeds its own heads or its own slice
of the MLP. The row-parallel projection that follows (o_proj, down_proj) sums the partial
products over the tensor group.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from frota.engine.parallel.comm import Comm


class _Wrapper(nn.Module):
    """One of the engine's modules (`inner`, this rank's shard) and the collective that
    completes its output; its weight is the shard's."""

    def __init__(self, inner: nn.Module, comm: Comm) -> None:
        super().__init__()
        self.inner = inner
        self.comm = [comm]  # a list: not a submodule

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight


class RowParallel(_Wrapper):
    """`inner` computes a partial product from this rank's input columns; all-reduce sums them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm[0].all_reduce(self.inner(x))


class VocabParallelEmbedding(_Wrapper):
    """Rows [start, start + n) of the embedding; ids outside the shard contribute zeros."""

    def __init__(self, inner: nn.Embedding, start: int, comm: Comm) -> None:
        super().__init__(inner, comm)
        self.start = start

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = self.inner.weight.shape[0]
        local = input_ids - self.start
        outside = (local < 0) | (local >= n)
        x = self.inner(local.masked_fill(outside, 0))
        x = x.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.comm[0].all_reduce(x)


class VocabParallelHead(_Wrapper):
    """Logits for this rank's vocabulary rows, gathered over the tensor group (padding dropped)."""

    def __init__(self, inner: nn.Module, vocab_size: int, comm: Comm) -> None:
        super().__init__(inner, comm)
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.comm[0].all_gather_last(self.inner(hidden))
        return logits[..., : self.vocab_size]


class ExpertParallelMoE(nn.Module):
    """This rank's experts (whole experts of its expert group, each sharded over the group's
    ranks along the intermediate dimension), behind the full, replicated router.

    Dispatch and combine: inside the tensor group every rank already holds every token (the
    attention output was all-reduced), so dispatch is a local selection of the (token, slot)
    pairs routed to local experts, and combine is the one all-reduce the layer needs anyway.
    That is the all-to-all's equivalent at no extra collective; a true all-to-all pays off
    only when attention is data-parallel and ranks hold different tokens.

    Capacity factor (optional): an expert takes at most ceil(cf * tokens * top_k / experts)
    (token, slot) pairs per step, in token order; an overflowing pair is dropped: it adds
    nothing, and the token's other experts keep their weights (no renormalisation), so the
    residual stream carries the token through that layer. Dropped pairs are counted.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 first_expert: int, num_local: int, comm: Comm,
                 capacity_factor: float | None) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.first_expert = first_expert
        self.num_local = num_local
        self.intermediate_size = intermediate_size  # this rank's shard of each expert
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(num_local, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_local, hidden_size, intermediate_size))
        self.comm = [comm]
        self.capacity_factor = capacity_factor
        # Routed (token, slot) pairs per expert; on the CPU even when built under meta/cuda.
        self.token_counts = torch.zeros(num_experts, dtype=torch.long, device="cpu")
        self.num_dropped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = router.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        flat = experts.flatten()
        counts = torch.bincount(flat, minlength=self.num_experts)
        counts_list = counts.tolist()
        self.token_counts += torch.tensor(counts_list)
        keep = None
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * x.shape[0] * self.top_k / self.num_experts)
            # Position of each pair among the pairs of its expert, in token order.
            one_hot = F.one_hot(flat, self.num_experts)
            position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
            keep = position < capacity
            self.num_dropped += int((~keep).sum())
        out = torch.zeros_like(x)
        order = flat.argsort(stable=True)
        start = sum(counts_list[: self.first_expert])
        flat_weights = weights.flatten()
        for local in range(self.num_local):
            n = counts_list[self.first_expert + local]
            idx = order[start : start + n]
            start += n
            if keep is not None:
                idx = idx[keep[idx]]
            if idx.numel() == 0:
                continue
            tok = idx // self.top_k
            gate, up = F.linear(x[tok], self.w13[local]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w2[local])
            out.index_add_(0, tok, y * flat_weights[idx].unsqueeze(-1))
        return self.comm[0].all_reduce(out)
