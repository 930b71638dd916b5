"""The expert-parallel MoE in one process: the same output as the engine's MoE, per-expert
counts, and the documented capacity-factor overflow (dropped pairs add nothing)."""

from __future__ import annotations

import torch

from frota.engine.config import ModelConfig
from frota.engine.model.moe import MixtureOfExperts
from frota.engine.parallel.comm import Comm
from frota.engine.parallel.config import ParallelConfig
from frota.engine.parallel.layers import ExpertParallelMoE

CFG = ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=8, num_layers=1, num_heads=2,
                  num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2)


def pair(capacity_factor: float | None) -> tuple[MixtureOfExperts, ExpertParallelMoE]:
    torch.manual_seed(0)
    ref = MixtureOfExperts(CFG)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    comm = Comm(ParallelConfig(), torch.device("cpu"))  # one rank: collectives are identities
    ep = ExpertParallelMoE(16, 8, 4, 2, 0, 4, comm, capacity_factor)
    with torch.no_grad():
        ep.gate.weight.copy_(ref.gate.weight)
        ep.w13.copy_(ref.w13)
        ep.w2.copy_(ref.w2)
    return ref, ep


def test_expert_parallel_moe_matches_the_engine_moe_and_counts_pairs():
    ref, ep = pair(None)
    x = torch.randn(10, 16)
    assert torch.allclose(ep(x), ref(x), atol=1e-6)
    assert int(ep.token_counts.sum()) == 10 * 2
    assert ep.num_dropped == 0


def test_capacity_overflow_drops_pairs_in_token_order():
    ref, ep = pair(0.5)  # capacity ceil(0.5 * 10 * 2 / 4) = 3 pairs per expert
    x = torch.randn(10, 16)
    out = ep(x)
    experts = torch.softmax(ep.gate(x), -1).topk(2, -1).indices
    counts = torch.bincount(experts.flatten(), minlength=4)
    assert ep.num_dropped == int((counts - 3).clamp(min=0).sum()) > 0
    # The first tokens are never dropped: their rows match the unlimited MoE.
    first = 0
    seen = torch.zeros(4, dtype=torch.long)
    for t in range(10):
        seen[experts[t]] += 1
        if (seen > 3).any():
            break
        first = t + 1
    assert first > 0
    assert torch.allclose(out[:first], ref(x)[:first], atol=1e-6)
