"""Per-rank memory budget: weight bytes, KV bytes per token, KV tokens that fit.

The one module where the bytes of a plan are worked out: from the spec's dtype,
quantization and memory to `frota.api.memory`'s accounting (the engine sizes its
KV pool with the same), and down to the tokens one replica holds. The engine
measures the real numbers at start-up; this is the plan the operator reports and
checks before asking the scheduler for pods.
"""

from __future__ import annotations

from dataclasses import dataclass

from frota.api import InferenceServiceSpec, Parallelism, Resources, memory
from frota.api.memory import ModelShape
from frota.plan.quantity import parse_quantity
from frota.plan.runtimes import resolve_dtype

# What a CPU worker process needs besides weights and KV cache (interpreter, torch, buffers).
CPU_RUNTIME_OVERHEAD_BYTES = 768 * 2**20


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
    # LoRA: slots x bytes of one slot on this rank (`frota.api.memory.lora_slot_bytes`), taken
    # from the memory before the KV cache; 0 when LoRA is off.
    adapter_slots: int = 0
    adapter_rank: int = 0
    adapter_bytes_per_rank: int = 0


def plan_memory(
    shape: ModelShape,
    parallelism: Parallelism,
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
    adapter_slots: int = 0,
    adapter_rank: int = 16,
) -> MemoryBudget:
    """The memory plan of one replica; kv fields are None when the rank's memory is unknown.

    Weights are the largest pipeline stage's. `cpu_runtime_overhead_bytes`: what the
    runtime's processes hold on CPU besides weights and KV cache; the vllm runtime passes
    its own. None is Frota's engine: its base, plus the second layout of unsharded bfloat16
    projections on CPUs with AMX (`frota.api.memory.cpu_second_layout_bytes`), as the
    operator cannot see the node's CPU. `adapter_slots` LoRA slots of rank `adapter_rank`
    are reserved on every rank before the KV cache (none: LoRA off).
    """
    p = parallelism
    weights = max(memory.weight_bytes_per_stage(shape, weight_quant, dtype,
                                                tensor=p.tensor, pipeline=p.pipeline))
    per_token = memory.kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                                          kv_quant, dtype, tensor=p.tensor, pipeline=p.pipeline)
    if cpu_runtime_overhead_bytes is None:
        cpu_runtime_overhead_bytes = CPU_RUNTIME_OVERHEAD_BYTES + (
            memory.cpu_second_layout_bytes(shape, weight_quant, dtype) if p == Parallelism() else 0)
    overhead = 0 if on_accelerator else cpu_runtime_overhead_bytes
    adapters = adapter_slots * memory.lora_slot_bytes(shape, adapter_rank, dtype, p.tensor,
                                                      pipeline=p.pipeline) if adapter_slots else 0
    lora = {"adapter_slots": adapter_slots, "adapter_rank": adapter_rank if adapter_slots else 0,
            "adapter_bytes_per_rank": adapters}
    if rank_memory_bytes is None:
        return MemoryBudget(weights, per_token, None, overhead, None, None, max_model_len, None, **lora)
    kv_bytes = int(rank_memory_bytes * memory_fraction) - overhead - weights - adapters
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
        **lora,
    )


def rank_memory_bytes(resources: Resources) -> int | None:
    """The memory one rank may use: its accelerators' (None when not declared), or the pod's."""
    if resources.accelerator is None:
        return int(parse_quantity(resources.memory))
    if resources.accelerator.memory is None:
        return None
    return int(parse_quantity(resources.accelerator.memory)) * resources.accelerator.count


def role_budget(spec: InferenceServiceSpec, shape: ModelShape, parallelism: Parallelism,
                resources: Resources, max_model_len: int,
                cpu_runtime_overhead_bytes: int | None = None) -> MemoryBudget:
    """The memory plan of one replica of a role sharded as `parallelism` on `resources`;
    `cpu_runtime_overhead_bytes`: the runtime's own on CPU, where it is not Frota's."""
    engine, lora = spec.engine, spec.lora
    return plan_memory(
        shape, parallelism,
        dtype=resolve_dtype(spec, resources),
        weight_quant=engine.quantization.weights,
        kv_quant=engine.quantization.kvCache,
        max_model_len=max_model_len,
        block_size=engine.kvCache.blockSize,
        memory_fraction=engine.kvCache.memoryFraction,
        rank_memory_bytes=rank_memory_bytes(resources),
        on_accelerator=resources.accelerator is not None,
        cpu_runtime_overhead_bytes=cpu_runtime_overhead_bytes,
        adapter_slots=lora.maxAdapters if lora else 0,
        adapter_rank=lora.maxRank if lora else 16,
    )
