"""The C++ prefill attention (kernels/prefill_attention.cpp) against SDPA, and where it runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from frota.engine import kernels
from frota.engine.attention import prefill_kernels

ops = kernels.cpu_kernels()
pytestmark = pytest.mark.skipif(ops is None or not ops.prefill_attention_takes(9, 3, 64),
                                reason="no C++ kernels built with AVX-512 BF16 here")


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], is_causal=True, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), [
    (1, 9, 3, 64), (5, 9, 3, 64), (17, 9, 3, 64), (300, 9, 3, 64),  # SmolLM2's grouping
    (33, 4, 4, 64), (70, 32, 8, 128), (40, 16, 1, 64),  # no grouping, 4 and 16 per KV head
])
def test_it_matches_float32_attention_as_closely_as_sdpa_in_bfloat16(tokens, heads, kv_heads, dim):
    torch.manual_seed(tokens)
    q = torch.randn(tokens, heads, dim, dtype=torch.bfloat16)
    k = torch.randn(tokens, kv_heads, dim, dtype=torch.bfloat16) * 2
    v = torch.randn(tokens, kv_heads, dim, dtype=torch.bfloat16)
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


def test_it_reads_strided_slices_of_a_fused_qkv():
    qkv = torch.randn(50, (9 + 2 * 3) * 64, dtype=torch.bfloat16)
    q, k, v = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=1)
    q, k, v = q.view(50, 9, 64), k.view(50, 3, 64), v.view(50, 3, 64)
    assert torch.equal(ops.prefill_attention(q[10:40], k[10:40], v[10:40], 0.125),
                       ops.prefill_attention(q[10:40].contiguous(), k[10:40].contiguous(),
                                             v[10:40].contiguous(), 0.125))


def test_it_runs_only_where_it_applies():
    q, k = torch.zeros(4, 9, 64, dtype=torch.bfloat16), torch.zeros(4, 3, 64, dtype=torch.bfloat16)
    assert prefill_kernels(q, k) is ops
    assert prefill_kernels(q.float(), k.float()) is None  # float32 keeps SDPA
    assert prefill_kernels(torch.zeros(4, 9, 80, dtype=torch.bfloat16),
                           torch.zeros(4, 3, 80, dtype=torch.bfloat16)) is None
    assert prefill_kernels(torch.zeros(4, 34, 64, dtype=torch.bfloat16),
                           torch.zeros(4, 2, 64, dtype=torch.bfloat16)) is None  # 17 per KV head
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.prefill_attention(q.float(), k.float(), k.float(), 0.125)
    with pytest.raises(RuntimeError, match="not 9 heads over 2"):
        ops.prefill_attention(q, k[:, :2], k[:, :2], 0.125)
