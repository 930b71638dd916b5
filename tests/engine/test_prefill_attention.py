"""The C++ prefill attention (kernels/prefill_attention.cpp, and prefill_attention_amx.cpp for
bfloat16 where the CPU has AMX tiles) against SDPA, and where it runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from frota.engine import kernels
from frota.engine import numeric_paths as paths
from frota.engine.attention import prefill_kernels
from frota.engine.kernels import isa

ops = kernels.cpu_kernels()
_q32, _k32 = torch.zeros(1, 9, 64), torch.zeros(1, 3, 64)


def _why_not(flag: str) -> str:
    """Why the kernel does not take this dtype here: the CPU feature it is built for, or no build."""
    if ops is None:
        return "Frota's C++ kernels cannot be built here"
    if flag not in (isa.host_cpu_flags() or frozenset()):
        return f"this CPU has no {flag}: the C++ prefill attention is built for it"
    return f"these C++ kernels were built without {flag} ({paths.kernels_summary()})"


if ops is None or not ops.prefill_attention_takes(_q32, _k32):  # one skip for the module
    pytest.skip(_why_not("avx512f"), allow_module_level=True)
BF16 = ops is not None and ops.prefill_attention_takes(_q32.bfloat16(), _k32.bfloat16())
bf16_only = pytest.mark.skipif(not BF16, reason=_why_not("avx512_bf16"))
AMX = ops is not None and ops.amx_available()


@pytest.fixture(autouse=True, params=["amx", "avx512"] if AMX else ["avx512"])
def bf16_path(request, monkeypatch):
    """bfloat16 runs on AMX tiles where the CPU has them; FROTA_AMX=0 takes the AVX-512 kernel,
    so every bfloat16 test runs both."""
    if request.param == "avx512":
        monkeypatch.setenv("FROTA_AMX", "0")
    return request.param


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q's tokens, the last of k's (any before them are prior context)."""
    past = k.shape[0] - q.shape[0]
    mask = torch.arange(k.shape[0])[None, :] <= torch.arange(past, k.shape[0])[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1)


def inputs(tokens: int, heads: int, kv_heads: int, dim: int, past: int = 0,
           dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(tokens + past)
    q = torch.randn(tokens, heads, dim).to(dtype)
    k = (torch.randn(past + tokens, kv_heads, dim) * 2).to(dtype)
    v = torch.randn(past + tokens, kv_heads, dim).to(dtype)
    return q, k, v


SHAPES = [
    (1, 9, 3, 64), (5, 9, 3, 64), (17, 9, 3, 64), (300, 9, 3, 64),  # SmolLM2's grouping
    (33, 4, 4, 64), (70, 32, 8, 128), (40, 16, 1, 64),  # no grouping, 4 and 16 per KV head
]


@bf16_only
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), SHAPES)
def test_it_matches_float32_attention_as_closely_as_sdpa_in_bfloat16(tokens, heads, kv_heads, dim):
    q, k, v = inputs(tokens, heads, kv_heads, dim)
    scale = dim ** -0.5
    exact = sdpa(q.float(), k.float(), v.float(), scale)
    got = ops.prefill_attention(q, k, v, scale)
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    sdpa_error = (sdpa(q, k, v, scale).float() - exact).abs().max().item()
    error = (got.float() - exact).abs().max().item()
    assert error <= 1.5 * sdpa_error + 1e-3, (error, sdpa_error)
    # The first token sees only itself: its output is its own value row, rounded.
    group = heads // kv_heads
    assert torch.equal(got[0], v[0].repeat_interleave(group, 0))


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), SHAPES)
def test_it_matches_sdpa_in_float32(tokens, heads, kv_heads, dim):
    q, k, v = inputs(tokens, heads, kv_heads, dim, dtype=torch.float32)
    got = ops.prefill_attention(q, k, v, dim ** -0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, sdpa(q, k, v, dim ** -0.5), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=bf16_only)])
@pytest.mark.parametrize(("tokens", "past"), [(1, 1), (1, 40), (7, 16), (31, 33), (200, 300)])
def test_a_chunk_after_prior_context_sees_all_of_it(dtype, tokens, past):
    q, k, v = inputs(tokens, 9, 3, 64, past=past, dtype=dtype)
    got = ops.prefill_attention(q, k, v, 0.125)
    want = sdpa(q.float(), k.float(), v.float(), 0.125)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    # Not the same as attending to the chunk alone.
    assert not torch.allclose(got.float(), sdpa(q.float(), k[past:].float(), v[past:].float(), 0.125),
                              atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=bf16_only)])
def test_it_reads_strided_slices_of_a_fused_qkv(dtype):
    qkv = torch.randn(50, (9 + 2 * 3) * 64).to(dtype)
    q, k, v = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=1)
    q, k, v = q.view(50, 9, 64), k.view(50, 3, 64), v.view(50, 3, 64)
    assert torch.equal(ops.prefill_attention(q[10:40], k[10:40], v[10:40], 0.125),
                       ops.prefill_attention(q[10:40].contiguous(), k[10:40].contiguous(),
                                             v[10:40].contiguous(), 0.125))


def test_it_runs_only_where_it_applies():
    q, k = torch.zeros(4, 9, 64), torch.zeros(4, 3, 64)
    assert prefill_kernels(q, k) is ops
    assert (prefill_kernels(q.bfloat16(), k.bfloat16()) is ops) == BF16
    assert prefill_kernels(q.half(), k.half()) is None
    assert prefill_kernels(torch.zeros(4, 9, 80), torch.zeros(4, 3, 80)) is None
    assert prefill_kernels(torch.zeros(4, 34, 64), torch.zeros(4, 2, 64)) is None  # 17 per KV head
    with pytest.raises(RuntimeError, match="takes float32"):
        ops.prefill_attention(q.half(), k.half(), k.half(), 0.125)
    with pytest.raises(RuntimeError, match="not 9 heads over 2"):
        ops.prefill_attention(q, k[:, :2], k[:, :2], 0.125)
    with pytest.raises(RuntimeError, match="last of k's"):
        ops.prefill_attention(q, k[:3], k[:3], 0.125)
