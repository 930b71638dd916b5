"""The planner's memory figures are `frota.api.memory`'s, per rank (torch-free)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from frota.api import memory
from frota.api.memory import KV_CACHE_DTYPES, QUANTIZATIONS
from frota.operator.memory import (
    CPU_RUNTIME_OVERHEAD_BYTES,
    Sharding,
    accounting_shape,
    kv_bytes_per_token,
    plan_memory,
    weight_bytes_per_stage,
)
from frota.operator.model_shapes import SMOLLM2_135M, synthetic_shape


@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_plans_kv_bytes_per_token_are_the_engines(kv_cache_dtype: str, dtype: str) -> None:
    s = SMOLLM2_135M
    planned = kv_bytes_per_token(s, Sharding(), dtype, kv_cache_dtype)
    assert planned == memory.kv_bytes_per_token(s.num_layers, s.num_kv_heads, s.head_dim,
                                                kv_cache_dtype, dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_a_quantized_kv_cache_counts_its_float16_scale_per_token_and_head(
    kv_cache_dtype: str,
) -> None:
    # 30 layers x K and V x 3 KV heads x (64 one-byte elements + a 2-byte scale)
    assert kv_bytes_per_token(SMOLLM2_135M, Sharding(), "bfloat16", kv_cache_dtype) == \
        30 * 2 * 3 * (64 + 2)


def test_a_rank_holds_its_stages_layers_and_its_share_of_the_kv_heads() -> None:
    one = kv_bytes_per_token(SMOLLM2_135M, Sharding(), "bfloat16", "int8")
    assert kv_bytes_per_token(SMOLLM2_135M, Sharding(tensor=3), "bfloat16", "int8") == one // 3
    assert kv_bytes_per_token(SMOLLM2_135M, Sharding(pipeline=2), "bfloat16", "int8") == one // 2
    # fewer KV heads than ranks: each rank keeps one head
    assert kv_bytes_per_token(SMOLLM2_135M, Sharding(tensor=9), "bfloat16", "int8") == one // 3


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("model", ["smollm2", "synthetic:moe-small", "synthetic:dense-small,tie=1"])
def test_one_rank_plans_the_engines_whole_model_weight_bytes(model: str, quantization: str) -> None:
    shape = SMOLLM2_135M if model == "smollm2" else synthetic_shape(model.split(":")[1])
    (planned,) = weight_bytes_per_stage(shape, Sharding(), "bfloat16", quantization)
    assert planned == memory.model_weight_bytes(accounting_shape(shape), quantization, "bfloat16")


def test_pipeline_stages_split_the_layers_and_each_end_holds_its_vocabulary_matrix() -> None:
    s = SMOLLM2_135M  # tied: one copy on one rank, two when the ends are different ranks
    (whole,) = weight_bytes_per_stage(s, Sharding(), "float32", "none")
    first, last = weight_bytes_per_stage(s, Sharding(pipeline=2), "float32", "none")
    vocab_matrix = s.vocab_size * s.hidden_size * 4
    assert first + last == whole + vocab_matrix
    assert last - first == s.hidden_size * 4  # the final norm


def _cpu_overhead(dtype: str, quantization: str = "none", sharding: Sharding | None = None) -> int:
    return plan_memory(SMOLLM2_135M, sharding or Sharding(), dtype=dtype, weight_quant=quantization, kv_quant="auto",
                       max_model_len=2048, block_size=16, memory_fraction=0.9, rank_memory_bytes=3 << 30,
                       on_accelerator=False).runtime_overhead_bytes


def test_a_bfloat16_cpu_plan_reserves_the_second_layout_of_the_projections() -> None:
    # 30 layers of qkv (960 x 576), o (576 x 576), gate/up (3072 x 576), down (576 x 1536), bf16
    second = 30 * (960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536) * 2
    assert memory.cpu_second_layout_bytes(accounting_shape(SMOLLM2_135M)) == second
    assert _cpu_overhead("bfloat16") == CPU_RUNTIME_OVERHEAD_BYTES + second
    # float32, quantized weights and sharded ranks keep one layout
    assert _cpu_overhead("float32") == _cpu_overhead("bfloat16", "int8") == CPU_RUNTIME_OVERHEAD_BYTES
    assert _cpu_overhead("bfloat16", sharding=Sharding(tensor=3)) == CPU_RUNTIME_OVERHEAD_BYTES


def test_api_memory_imports_without_torch() -> None:
    code = ("import sys, frota.api.memory, frota.operator.memory; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
