"""The quantized KV pool and the torch-free memory accounting."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from frota.api import memory as accounting
from frota.engine.quant.kv import QuantizedKVCache, allocate_kv_pool, dequantize_kv, quantize_kv


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_kv_round_trip_within_bound(kind: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(10, 3, 64) * torch.logspace(-1, 2, 10)[:, None, None]
    values, scales = quantize_kv(x, kind)
    assert scales.shape == (10, 3) and scales.dtype == torch.float16
    back = dequantize_kv(values, scales, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    # int8: half a step of absmax/127 (+ float16 scale rounding); e4m3: 3 mantissa bits
    bound = amax / 254 * 1.01 if kind == "int8" else amax * 2**-4
    assert torch.all((back - x).abs() <= bound)


def test_quantized_pool_indexes_like_the_float_pool() -> None:
    torch.manual_seed(0)
    shape = (6, 3, 4, 64)  # blocks, kv heads, block size, head dim
    ref = torch.zeros(shape)
    pool = QuantizedKVCache(*shape, kind="int8", dtype=torch.float32)
    blocks, offsets = torch.tensor([0, 0, 5, 2]), torch.tensor([0, 1, 3, 2])
    k = torch.randn(4, 3, 64)
    ref[blocks, :, offsets] = k
    pool[blocks, :, offsets] = k
    assert pool.shape == shape
    ids = torch.tensor([5, 0, 2])
    torch.testing.assert_close(pool[ids], ref[ids], atol=0.02, rtol=0.01)
    torch.testing.assert_close(pool.index_select(0, ids), ref[ids], atol=0.02, rtol=0.01)


def test_int8_pool_halves_bfloat16_kv_memory() -> None:
    shape = dict(num_layers=2, num_blocks=8, num_kv_heads=3, block_size=16, head_dim=64)
    float_pool = allocate_kv_pool(**shape, kv_cache_dtype="auto", dtype=torch.bfloat16)
    int8_pool = allocate_kv_pool(**shape, kv_cache_dtype="int8", dtype=torch.bfloat16)
    float_bytes = sum(t.numel() * t.element_size() for kv in float_pool for t in kv)
    int8_bytes = sum(t.nbytes() for kv in int8_pool for t in kv)
    assert int8_bytes <= 0.52 * float_bytes
    # the accounting says the same as the allocation
    per_token = accounting.kv_bytes_per_token(2, 3, 64, "int8")
    assert per_token * 8 * 16 == int8_bytes
    assert accounting.kv_bytes_per_token(2, 3, 64, "auto", "bfloat16") * 8 * 16 == float_bytes


def test_accounting_weights_shrink_with_the_format() -> None:
    smollm2 = accounting.ModelShape(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True,
    )
    bf16 = accounting.model_weight_bytes(smollm2, "none", "bfloat16")
    int8 = accounting.model_weight_bytes(smollm2, "int8", "bfloat16")
    int4 = accounting.model_weight_bytes(smollm2, "int4", "bfloat16", quantize_lm_head=False)
    assert 130e6 * 2 < bf16 < 140e6 * 2
    assert int8 < 0.55 * bf16
    assert int4 < 0.55 * bf16
    lin = accounting.linear_weight_bytes
    assert lin(1536, 576, "int4") < lin(1536, 576, "int8") < lin(1536, 576, "none", "bfloat16")
    assert accounting.linear_weight_bytes(576, 576, "int4", group_size=32) == 576 * 288 + 576 * 18 * 8
    assert accounting.num_kv_blocks(2**20, 16, 30, 3, 64, "int8") > accounting.num_kv_blocks(
        2**20, 16, 30, 3, 64, "auto"
    )
    with pytest.raises(ValueError, match="use one of"):
        accounting.kv_bytes_per_token(2, 3, 64, "int3")


def test_accounting_imports_without_torch() -> None:
    code = (
        "import sys, importlib.util, pathlib\n"
        "import frota.api.memory as a\n"
        "assert 'torch' not in sys.modules, 'accounting pulled in torch'\n"
        "print(a.kv_bytes_per_token(30, 3, 64))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
