"""Per-rank memory budget: weight bytes, KV bytes per token, KV tokens that fit.

Pure arithmetic over a ModelShape and the parallel sizes; the engine measures
the real numbers at start-up, this is the plan the operator reports and checks
before asking the scheduler for pods. The bytes themselves come from
`frota.api.memory`, the accounting the engine sizes its KV pool with.
"""

from __future__ import annotations

from dataclasses import dataclass

from frota.api import memory
from frota.operator.model_shapes import ModelShape

# What a CPU worker process needs besides weights and KV cache (interpreter, torch, buffers).
CPU_RUNTIME_OVERHEAD_BYTES = 768 * 2**20


@dataclass(frozen=True)
class Sharding:
    """Parallel sizes of one replica."""

    tensor: int = 1
    pipeline: int = 1
    expert: int = 1


@dataclass(frozen=True)
class MemoryBudget:
    """What one rank holds and what one replica can serve. None: the rank's memory is unknown."""

    weight_bytes_per_rank: int
    kv_bytes_per_token_per_rank: int
    rank_memory_bytes: int | None
    runtime_overhead_bytes: int
    kv_cache_bytes_per_rank: int | None
    kv_cache_tokens_per_replica: int | None
    max_model_len: int
    sequences_at_max_model_len: int | None


def accounting_shape(shape: ModelShape) -> memory.ModelShape:
    """The dimensions `frota.api.memory` reads (an MoE's per-expert MLP size)."""
    return memory.ModelShape(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.moe_intermediate_size if shape.is_moe else shape.intermediate_size,
        num_layers=shape.num_layers, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings,
        num_experts=shape.num_experts,
    )


def weight_bytes_per_stage(
    shape: ModelShape, sharding: Sharding, dtype: str, weight_quant: str
) -> list[int]:
    """Weight bytes of one rank in each pipeline stage (stage 0 holds the embedding)."""
    return memory.weight_bytes_per_stage(accounting_shape(shape), weight_quant, dtype,
                                         tensor=sharding.tensor, pipeline=sharding.pipeline)


def kv_bytes_per_token(shape: ModelShape, sharding: Sharding, dtype: str, kv_quant: str) -> int:
    """KV cache bytes one token takes on one rank (K and V, every layer of its stage)."""
    return memory.kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                                     kv_quant, dtype, tensor=sharding.tensor,
                                     pipeline=sharding.pipeline)


def plan_memory(
    shape: ModelShape,
    sharding: Sharding,
    *,
    dtype: str,
    weight_quant: str,
    kv_quant: str,
    max_model_len: int,
    block_size: int,
    memory_fraction: float,
    rank_memory_bytes: int | None,
    on_accelerator: bool,
    cpu_runtime_overhead_bytes: int | None = None,
) -> MemoryBudget:
    """The memory plan of one replica; kv fields are None when the rank's memory is unknown.

    `cpu_runtime_overhead_bytes`: what the runtime's processes hold on CPU besides weights
    and KV cache; the vllm runtime passes its own. None is Frota's engine: its base, plus
    the second layout of unsharded bfloat16 projections on CPUs with AMX
    (`frota.api.memory.cpu_second_layout_bytes`), as the operator cannot see the node's CPU.
    """
    weights = max(weight_bytes_per_stage(shape, sharding, dtype, weight_quant))
    per_token = kv_bytes_per_token(shape, sharding, dtype, kv_quant)
    if cpu_runtime_overhead_bytes is None:
        unsharded = sharding == Sharding()
        cpu_runtime_overhead_bytes = CPU_RUNTIME_OVERHEAD_BYTES + (
            memory.cpu_second_layout_bytes(accounting_shape(shape), weight_quant, dtype) if unsharded else 0)
    overhead = 0 if on_accelerator else cpu_runtime_overhead_bytes
    if rank_memory_bytes is None:
        return MemoryBudget(weights, per_token, None, overhead, None, None, max_model_len, None)
    kv_bytes = int(rank_memory_bytes * memory_fraction) - overhead - weights
    tokens = max(0, kv_bytes) // per_token // block_size * block_size
    return MemoryBudget(
        weight_bytes_per_rank=weights,
        kv_bytes_per_token_per_rank=per_token,
        rank_memory_bytes=rank_memory_bytes,
        runtime_overhead_bytes=overhead,
        kv_cache_bytes_per_rank=max(0, kv_bytes),
        kv_cache_tokens_per_replica=tokens,
        max_model_len=max_model_len,
        sequences_at_max_model_len=tokens // max_model_len,
    )
