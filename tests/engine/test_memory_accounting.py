"""The operator's memory plan and what the engine really allocates agree (frota.api.memory)."""

from __future__ import annotations

import pytest
import torch

from frota.api import Parallelism
from frota.api.memory import (
    KV_CACHE_DTYPES,
    ModelShape,
    cpu_second_layout_bytes,
    model_weight_bytes,
)
from frota.engine import EngineArgs
from frota.engine.kernels.linear import amx_ops
from frota.engine.llm_engine import LLMEngine
from frota.engine.quant.apply import quantized_weight_bytes
from frota.engine.quant.kv import allocate_kv_pool
from frota.plan.memory import plan_memory
from frota.plan.model_shapes import synthetic_shape

SPEC = "dense-small"  # 4 layers, 4 KV heads of 32


def _planned_kv_bytes_per_token(shape: ModelShape, dtype: str, kv_cache_dtype: str) -> int:
    return plan_memory(shape, Parallelism(), dtype=dtype, weight_quant="none", kv_quant=kv_cache_dtype,
                       max_model_len=64, block_size=8, memory_fraction=0.9, rank_memory_bytes=None,
                       on_accelerator=False).kv_bytes_per_token_per_rank


def _pool_bytes(pool: list) -> int:
    return sum(t.numel() * t.element_size() if isinstance(t, torch.Tensor) else t.nbytes()
               for kv in pool for t in kv)


@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_planned_kv_bytes_per_token_are_the_allocated_pools(kv_cache_dtype: str,
                                                                dtype: str) -> None:
    shape = synthetic_shape(SPEC)
    num_blocks, block_size = 3, 8
    pool = allocate_kv_pool(shape.num_layers, num_blocks, shape.num_kv_heads, block_size,
                            shape.head_dim, kv_cache_dtype, getattr(torch, dtype))
    planned = _planned_kv_bytes_per_token(shape, dtype, kv_cache_dtype)
    assert planned * num_blocks * block_size == _pool_bytes(pool)


@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
def test_the_engine_sizes_its_pool_with_the_planned_bytes(kv_cache_dtype: str) -> None:
    memory_bytes, block_size = 1 << 20, 8
    engine = LLMEngine(EngineArgs(model=f"synthetic:{SPEC}", dtype="float32", device="cpu",
                                  kv_cache_dtype=kv_cache_dtype, kv_cache_memory=memory_bytes,
                                  block_size=block_size, verbose=False))
    planned = _planned_kv_bytes_per_token(synthetic_shape(SPEC), "float32", kv_cache_dtype)
    assert engine.block_manager.num_blocks == memory_bytes // (planned * block_size)
    held = _pool_bytes(engine.runner.kv_caches)
    assert held == engine.block_manager.num_blocks * block_size * planned
    if kv_cache_dtype != "auto":  # the float16 scale of each (token, head) is in the pool
        assert planned == 2 * 4 * 4 * (32 + 2)


@pytest.mark.parametrize(("spec", "quantization", "dtype"), [
    ("dense-tiny", "none", "bfloat16"),
    ("dense-tiny", "int8", "bfloat16"),
    ("dense-tiny,tie=1", "int8", "float32"),
    ("moe-tiny", "int4", "float32"),
])
def test_the_accounted_weight_bytes_are_what_the_engine_holds(spec: str, quantization: str,
                                                              dtype: str) -> None:
    engine = LLMEngine(EngineArgs(model=f"synthetic:{spec}", dtype=dtype, device="cpu",
                                  quantization=quantization, num_kv_blocks=4, verbose=False))
    shape = engine.model_config  # the engine's config is the accounting's ModelShape
    assert isinstance(shape, ModelShape)
    # On a CPU with AMX tiles, unquantized bfloat16 projections are held in a second layout
    # too, which the plan reserves as runtime memory (frota.plan.memory.plan_memory).
    second = cpu_second_layout_bytes(shape, quantization, dtype) if amx_ops() is not None else 0
    assert quantized_weight_bytes(engine.runner.model) == model_weight_bytes(shape, quantization,
                                                                             dtype) + second
