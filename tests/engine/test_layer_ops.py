"""The fused CPU layer ops equal the PyTorch chains they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from frota.engine.kernels import cpu_kernels
from frota.engine.model.layers import RMSNorm, RotaryEmbedding

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C++ compiler: the CPU kernels are off")
DTYPES = [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)]


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_rms_norm_and_fused_residual_add(dtype, tol, rows):
    torch.manual_seed(rows)
    norm = RMSNorm(96, 1e-5).to(dtype)
    norm.weight.data.normal_()
    x, residual = torch.randn(rows, 96, dtype=dtype), torch.randn(rows, 96, dtype=dtype)
    torch.testing.assert_close(cpu_kernels().rms_norm(x, norm.weight, 1e-5), norm._norm(x), atol=tol, rtol=tol)
    want_sum = residual + x
    want = norm._norm(want_sum)
    got = cpu_kernels().add_rms_norm(x, residual, norm.weight, 1e-5)
    torch.testing.assert_close(residual, want_sum, atol=0, rtol=0)  # added in place, rounded like torch
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_norm_module_uses_the_same_result_either_way():
    norm = RMSNorm(32, 1e-6)
    x, residual = torch.randn(4, 32), torch.randn(4, 32)
    out, new_residual = norm(x, residual=residual.clone())
    torch.testing.assert_close(new_residual, residual + x)
    torch.testing.assert_close(out, norm._norm(residual + x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_rope_and_cache_equals_rotary_then_write(dtype, tol, heads, kv_heads):
    torch.manual_seed(heads)
    dim, block, tokens = 64, 16, 21
    rotary = RotaryEmbedding(dim, 4096, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype)
    positions = torch.randint(0, 4000, (tokens,))
    slots = torch.randperm(8 * block)[:tokens]
    k_cache = torch.zeros(8, kv_heads, block, dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    q, k, v = qkv.clone().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    want_q, want_k = rotary(positions, q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim))
    cpu_kernels().rope_and_cache(qkv, positions, rotary.cos, rotary.sin, k_cache, v_cache,
                                 slots // block, slots % block, heads, kv_heads)
    got_q = qkv[:, : heads * dim].reshape(tokens, heads, dim)
    got_k = qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(tokens, kv_heads, dim)
    torch.testing.assert_close(got_q, want_q, atol=tol, rtol=tol)
    torch.testing.assert_close(got_k, want_k, atol=tol, rtol=tol)
    cached_k = k_cache[slots // block, :, slots % block]
    cached_v = v_cache[slots // block, :, slots % block]
    torch.testing.assert_close(cached_k, got_k, atol=0, rtol=0)
    torch.testing.assert_close(cached_v, v.reshape(tokens, kv_heads, dim), atol=0, rtol=0)
    assert k_cache.abs().sum(-1).ne(0).sum() == tokens * kv_heads  # nothing else written


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_silu_and_mul(dtype, tol):
    gate_up = torch.randn(7, 2 * 48, dtype=dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels().silu_and_mul(gate_up), F.silu(gate) * up, atol=tol, rtol=tol)


@pytest.mark.parametrize("width", [49152, 1000, 7])  # vocab sizes: whole vectors, a tail, only a tail
def test_argmax_rows_equals_torch_argmax_with_ties_and_masks(width):
    torch.manual_seed(width)
    logits = torch.randn(6, width)
    logits[1] = float("-inf")  # a row a grammar masked entirely: torch answers 0
    logits[2, width // 3] = logits[2, width // 2] = 1e9  # a tie: the first index wins
    logits[3] = 0.0  # all equal
    logits[4, : width - 1] = float("-inf")  # only the last token allowed
    torch.testing.assert_close(cpu_kernels().argmax_rows(logits), logits.argmax(dim=-1), atol=0, rtol=0)


def test_greedy_sampling_uses_the_kernel_and_answers_as_argmax(monkeypatch):
    from frota.engine import sampler

    logits = torch.randn(5, 300)
    calls = []
    real = cpu_kernels().argmax_rows
    monkeypatch.setattr(sampler.kernels, "for_tensor", lambda t: type("Ops", (), {
        "argmax_rows": staticmethod(lambda x: calls.append(x.shape) or real(x))}))
    torch.testing.assert_close(sampler.greedy(logits), logits.argmax(dim=-1), atol=0, rtol=0)
    assert calls == [logits.shape]
    assert torch.equal(sampler.greedy(logits.t().contiguous().t()), logits.argmax(dim=-1))  # strided: torch's


def test_bad_shapes_are_refused():
    ops = cpu_kernels()
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.silu_and_mul(torch.randn(8, 6).t())
    with pytest.raises(RuntimeError, match="even"):
        ops.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops.add_rms_norm(torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="width"):
        cache = torch.zeros(2, 1, 4, 8)
        ops.rope_and_cache(torch.randn(3, 20), torch.zeros(3, dtype=torch.long), torch.ones(8, 8),
                           torch.ones(8, 8), cache, cache.clone(), torch.zeros(3, dtype=torch.long),
                           torch.zeros(3, dtype=torch.long), 1, 1)
    with pytest.raises(RuntimeError, match="float32"):
        ops.argmax_rows(torch.randn(2, 8, dtype=torch.bfloat16))
