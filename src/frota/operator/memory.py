"""Per-rank memory budget: weight bytes, KV bytes per token, KV tokens that fit.

Pure arithmetic over a ModelShape and the parallel sizes; the engine measures
the real numbers at start-up, this is the plan the operator reports and checks
before asking the scheduler for pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frota.operator.model_shapes import ModelShape

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
# Bytes per weight of the quantized linear layers (int4 carries one fp16 scale per 32 weights).
WEIGHT_QUANT_BYTES = {"int8": 1.0, "int4": 0.5 + 2 / 32, "fp8": 1.0}
KV_QUANT_BYTES = {"int8": 1.0, "fp8": 1.0}
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


def weight_bytes_per_stage(
    shape: ModelShape, sharding: Sharding, dtype: str, weight_quant: str
) -> list[int]:
    """Weight bytes of one rank in each pipeline stage (stage 0 holds the embedding)."""
    dtype_bytes = DTYPE_BYTES[dtype]
    linear_bytes = WEIGHT_QUANT_BYTES.get(weight_quant, dtype_bytes)
    tp = sharding.tensor
    h, hd = shape.hidden_size, shape.head_dim
    kv_heads_per_rank = max(1, shape.num_kv_heads // tp)
    attn = 2 * h * shape.num_heads * hd / tp + 2 * h * kv_heads_per_rank * hd
    if shape.is_moe:
        # Each rank holds num_experts/expert experts, each split over tensor/expert ranks.
        mlp = shape.num_experts * 3 * h * shape.moe_intermediate_size / tp
        gate = h * shape.num_experts * dtype_bytes
    else:
        mlp = 3 * h * shape.intermediate_size / tp
        gate = 0.0
    per_layer = (attn + mlp) * linear_bytes + gate + 2 * h * dtype_bytes
    layers = math.ceil(shape.num_layers / sharding.pipeline)
    embedding = shape.vocab_size * h / tp * dtype_bytes
    stages = [layers * per_layer for _ in range(sharding.pipeline)]
    stages[0] += embedding
    if sharding.pipeline > 1 or not shape.tie_word_embeddings:
        stages[-1] += embedding  # the LM head: a separate copy unless tied on the same rank
    stages[-1] += h * dtype_bytes  # final norm
    return [int(s) for s in stages]


def kv_bytes_per_token(shape: ModelShape, sharding: Sharding, dtype: str, kv_quant: str) -> int:
    """KV cache bytes one token takes on one rank (K and V, every layer of its stage)."""
    elem = KV_QUANT_BYTES.get(kv_quant, DTYPE_BYTES[dtype])
    kv_heads_per_rank = max(1, shape.num_kv_heads // sharding.tensor)
    layers = math.ceil(shape.num_layers / sharding.pipeline)
    return int(2 * layers * kv_heads_per_rank * shape.head_dim * elem)


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
) -> MemoryBudget:
    """The memory plan of one replica; kv fields are None when the rank's memory is unknown."""
    weights = max(weight_bytes_per_stage(shape, sharding, dtype, weight_quant))
    per_token = kv_bytes_per_token(shape, sharding, dtype, kv_quant)
    overhead = 0 if on_accelerator else CPU_RUNTIME_OVERHEAD_BYTES
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
