"""Decode attention over the paged pool: the C++ kernel and the PyTorch path both equal
plain attention over each sequence's contiguous K/V."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from frota.engine.attention import AttentionMetadata, decode_attention, decode_attention_torch
from frota.engine.kernels import cpu_kernels

BLOCK = 16


def _pool(lens: list[int], heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0,
          block: int = BLOCK):
    """A shuffled block pool holding each sequence's K/V, plus the reference output."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block) for n in lens]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(num_blocks, kv_heads, block, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, kv_heads, block, dim, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [order[sum(blocks_per_seq[:i]) : sum(blocks_per_seq[: i + 1])] for i in range(len(lens))]
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    width = max(blocks_per_seq)
    meta = AttentionMetadata(slot_blocks=torch.empty(0), slot_offsets=torch.empty(0), num_decodes=len(lens))
    meta.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    meta.decode_context_lens = torch.tensor(lens, dtype=torch.int32)
    reference = []
    for i, n in enumerate(lens):
        keys = k_cache[tables[i]].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :n].float()
        values = v_cache[tables[i]].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :n].float()
        o = F.scaled_dot_product_attention(q[i].float().unsqueeze(1), keys, values, enable_gqa=True,
                                           scale=dim**-0.5)
        reference.append(o.squeeze(1))
    return q, k_cache, v_cache, meta, torch.stack(reference)


LENGTHS = [[1], [16], [17], [5, 300, 33, 16, 48, 1, 129]]


@pytest.mark.parametrize("lens", LENGTHS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
def test_torch_path_equals_reference(lens, heads, kv_heads):
    q, k, v, meta, ref = _pool(lens, heads, kv_heads, 64, torch.float32)
    out = decode_attention_torch(q, k, v, meta, 64**-0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


needs_kernel = pytest.mark.skipif(cpu_kernels() is None, reason="no C++ compiler: the CPU kernels are off")


@needs_kernel
@pytest.mark.parametrize("lens", LENGTHS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_equals_reference(lens, heads, kv_heads, dtype, tol):
    q, k, v, meta, ref = _pool(lens, heads, kv_heads, 64, dtype)
    out = decode_attention(q, k, v, meta, 64**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_kernel
@pytest.mark.parametrize("dim", [128, 80, 40, 8])  # unrolled (64 above, 128) and generic sizes
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_equals_reference_at_other_head_sizes(dim, dtype, tol):
    q, k, v, meta, ref = _pool(LENGTHS[-1], 8, 2, dim, dtype, seed=dim)
    out = decode_attention(q, k, v, meta, dim**-0.5)
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_kernel
@pytest.mark.parametrize("block", [4, 8, 32, 48])  # tiles of 16 keys: part of one, or several per block
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_equals_reference_at_other_block_sizes(block, dtype, tol):
    q, k, v, meta, ref = _pool(LENGTHS[-1], 9, 3, 64, dtype, seed=block, block=block)
    out = decode_attention(q, k, v, meta, 64**-0.5)
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_kernel
@pytest.mark.parametrize(("lens", "heads", "kv_heads", "dim"), [
    ([700], 32, 8, 128),  # one sequence: its KV heads split over the threads
    ([3, 2000, 64], 16, 1, 64),  # a group of 16 query heads, a long context
    ([40, 9], 4, 4, 128),  # no grouping
])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_kernel_equals_reference_across_task_shapes(lens, heads, kv_heads, dim, dtype, tol):
    q, k, v, meta, ref = _pool(lens, heads, kv_heads, dim, dtype, seed=len(lens))
    out = decode_attention(q, k, v, meta, dim**-0.5)
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@needs_kernel
def test_kernel_gives_zeros_for_an_empty_context():
    q, k, v, meta, ref = _pool([5, 20], 9, 3, 64, torch.float32)
    meta.decode_context_lens[0] = 0
    out = decode_attention(q, k, v, meta, 64**-0.5)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1], ref[1], atol=1e-5, rtol=1e-5)


@needs_kernel
def test_kernel_rejects_mismatched_inputs():
    q, k, v, meta, _ = _pool([20], 9, 3, 64, torch.float32)
    kernels = cpu_kernels()
    with pytest.raises(RuntimeError, match="int32"):
        kernels.paged_decode_attention(q, k, v, meta.decode_block_tables.long(), meta.decode_context_lens, 0.1)
    with pytest.raises(RuntimeError, match="multiple of kv_heads"):
        kernels.paged_decode_attention(q[:, :8], k, v, meta.decode_block_tables, meta.decode_context_lens, 0.1)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernels.paged_decode_attention(q.double(), k, v, meta.decode_block_tables, meta.decode_context_lens, 0.1)


def test_kernels_can_be_turned_off(monkeypatch):
    from frota.engine.kernels import build

    monkeypatch.setattr(build, "_loaded", {})  # the real modules come back after the test
    monkeypatch.setenv("FROTA_CPU_KERNELS", "0")
    assert cpu_kernels() is None
    q, k, v, meta, ref = _pool([40, 3], 9, 3, 64, torch.float32)
    torch.testing.assert_close(decode_attention(q, k, v, meta, 64**-0.5), ref, atol=1e-5, rtol=1e-5)
