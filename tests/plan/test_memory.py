"""The planner's memory figures are `frota.api.memory`'s, per rank (torch-free)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from frota.api import Parallelism, memory
from frota.api.memory import KV_CACHE_DTYPES, QUANTIZATIONS, ModelShape
from frota.plan.memory import CPU_RUNTIME_OVERHEAD_BYTES, MemoryBudget, plan_memory
from frota.plan.model_shapes import SMOLLM2_135M, synthetic_shape


def _plan(shape: ModelShape, parallelism: Parallelism | None = None, dtype: str = "bfloat16",
          weight_quant: str = "none", kv_quant: str = "auto",
          rank_memory_bytes: int | None = None) -> MemoryBudget:
    return plan_memory(shape, parallelism or Parallelism(), dtype=dtype, weight_quant=weight_quant,
                       kv_quant=kv_quant, max_model_len=2048, block_size=16, memory_fraction=0.9,
                       rank_memory_bytes=rank_memory_bytes, on_accelerator=False)


def kv_bytes_per_token(shape: ModelShape, parallelism: Parallelism, dtype: str, kv_quant: str) -> int:
    return _plan(shape, parallelism, dtype, kv_quant=kv_quant).kv_bytes_per_token_per_rank


def weight_bytes_per_rank(shape: ModelShape, parallelism: Parallelism, dtype: str, quantization: str) -> int:
    return _plan(shape, parallelism, dtype, quantization).weight_bytes_per_rank


@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_plans_kv_bytes_per_token_are_the_engines(kv_cache_dtype: str, dtype: str) -> None:
    s = SMOLLM2_135M
    planned = kv_bytes_per_token(s, Parallelism(), dtype, kv_cache_dtype)
    assert planned == memory.kv_bytes_per_token(s.num_layers, s.num_kv_heads, s.head_dim,
                                                kv_cache_dtype, dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_a_quantized_kv_cache_counts_its_float16_scale_per_token_and_head(
    kv_cache_dtype: str,
) -> None:
    # 30 layers x K and V x 3 KV heads x (64 one-byte elements + a 2-byte scale)
    assert kv_bytes_per_token(SMOLLM2_135M, Parallelism(), "bfloat16", kv_cache_dtype) == \
        30 * 2 * 3 * (64 + 2)


def test_a_rank_holds_its_stages_layers_and_its_share_of_the_kv_heads() -> None:
    one = kv_bytes_per_token(SMOLLM2_135M, Parallelism(), "bfloat16", "int8")
    assert kv_bytes_per_token(SMOLLM2_135M, Parallelism(tensor=3), "bfloat16", "int8") == one // 3
    assert kv_bytes_per_token(SMOLLM2_135M, Parallelism(pipeline=2), "bfloat16", "int8") == one // 2
    # fewer KV heads than ranks: each rank keeps one head
    assert kv_bytes_per_token(SMOLLM2_135M, Parallelism(tensor=9), "bfloat16", "int8") == one // 3


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("model", ["smollm2", "synthetic:moe-small", "synthetic:dense-small,tie=1"])
def test_one_rank_plans_the_engines_whole_model_weight_bytes(model: str, quantization: str) -> None:
    shape = SMOLLM2_135M if model == "smollm2" else synthetic_shape(model.split(":")[1])
    planned = weight_bytes_per_rank(shape, Parallelism(), "bfloat16", quantization)
    assert planned == memory.model_weight_bytes(shape, quantization, "bfloat16")


def test_a_pipelined_rank_plans_its_largest_stage_the_one_with_the_lm_head() -> None:
    s = SMOLLM2_135M  # tied: one copy on one rank, two when the ends are different ranks
    whole = weight_bytes_per_rank(s, Parallelism(), "float32", "none")
    first, last = memory.weight_bytes_per_stage(s, "none", "float32", pipeline=2)
    vocab_matrix = s.vocab_size * s.hidden_size * 4
    assert first + last == whole + vocab_matrix
    assert last - first == s.hidden_size * 4  # the final norm
    assert weight_bytes_per_rank(s, Parallelism(pipeline=2), "float32", "none") == last


def _cpu_overhead(dtype: str, quantization: str = "none", parallelism: Parallelism | None = None) -> int:
    return _plan(SMOLLM2_135M, parallelism, dtype, quantization, rank_memory_bytes=3 << 30).runtime_overhead_bytes


def test_a_bfloat16_cpu_plan_reserves_the_second_layout_of_the_projections() -> None:
    # 30 layers of qkv (960 x 576), o (576 x 576), gate/up (3072 x 576), down (576 x 1536), bf16
    second = 30 * (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536) * 2
    assert memory.cpu_second_layout_bytes(SMOLLM2_135M) == second
    assert _cpu_overhead("bfloat16") == CPU_RUNTIME_OVERHEAD_BYTES + second
    # float32, quantized weights and sharded ranks keep one layout
    assert _cpu_overhead("float32") == _cpu_overhead("bfloat16", "int8") == CPU_RUNTIME_OVERHEAD_BYTES
    assert _cpu_overhead("bfloat16", parallelism=Parallelism(tensor=3)) == CPU_RUNTIME_OVERHEAD_BYTES


def test_api_memory_imports_without_torch() -> None:
    code = ("import sys, frota.api.memory, frota.plan.memory; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
