"""Paged attention in plain PyTorch.

The KV pool of one layer is `[num_blocks, num_kv_heads, block_size, head_dim]`.
New keys and values are written into it through `slot_mapping`. Queries come as
one flat, unpadded token stream: first one token per decoding sequence, then the
chunks of sequences in prefill.

- Decode: all decoding sequences at once. On the CPU, a C++ kernel
  (`frota.engine.kernels`) reads each sequence's K/V rows in place through its
  block table. Elsewhere, or without a compiler, the PyTorch path gathers the
  blocks of every sequence into one `[num_blocks_total, ...]` batch, computes
  scores per block with one batched matmul, and combines the blocks with a
  segmented softmax (max and sum reduced per sequence with scatter/index_add).
  Neither pads to the longest sequence.
- Prefill: on a CPU with AVX-512 (bfloat16 also needs AVX-512 BF16), each
  chunk runs the C++ kernel's flash attention (`prefill_attention.cpp`, 2.7-4x
  SDPA's speed in bfloat16); elsewhere each chunk is one SDPA call. A chunk with
  prior context (an earlier chunk, or a prefix-cache hit) reads that context
  through its block table; SDPA then takes the causal mask shifted by the
  context length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from frota.engine import kernels


@dataclass
class PrefillSpan:
    """One sequence's chunk in the flat token stream."""

    start: int  # first token of the chunk in the stream
    num_tokens: int
    context_len: int  # tokens with KV after this step (prior context + the chunk)
    block_table: torch.Tensor | None  # set when there is prior context to read

    @cached_property
    def mask(self) -> torch.Tensor:
        """`[num_tokens, context_len]` bool: the causal mask over prior context and chunk,
        for SDPA (built once per step, on first use: the C++ kernel needs none)."""
        device = self.block_table.device if self.block_table is not None else None
        keys = torch.arange(self.context_len, device=device)
        return keys.unsqueeze(0) <= keys[self.context_len - self.num_tokens :].unsqueeze(1)


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step, shared by all layers."""

    slot_blocks: torch.Tensor  # [T] block of each new token's slot
    slot_offsets: torch.Tensor  # [T] offset inside that block
    num_decodes: int = 0
    decode_block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, rows padded with 0
    decode_context_lens: torch.Tensor | None = None  # [B] int32, tokens with KV incl. this one
    prefills: list[PrefillSpan] = field(default_factory=list)
    lora: Any = None  # frota.engine.lora.batch.LoRABatch: the rows under an adapter, if any
    _gather: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def decode_gather(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the PyTorch decode path, computed once per step: (block ids of all decoding
        sequences [NB], the sequence owning each [NB], a 0/-inf mask [NB, 1, 1, block_size])."""
        if self._gather is None:
            tables, lens = self.decode_block_tables, self.decode_context_lens.long()
            num_blocks = (lens + block_size - 1) // block_size
            used = torch.arange(tables.shape[1], device=tables.device).unsqueeze(0) < num_blocks.unsqueeze(1)
            owner = torch.arange(tables.shape[0], device=tables.device).repeat_interleave(num_blocks)
            ids = tables[used].long()
            # Slots of a block at or past the sequence's length are masked out.
            starts = torch.cumsum(num_blocks, 0) - num_blocks  # each sequence's first row in ids
            index_in_seq = torch.arange(ids.shape[0], device=ids.device) - starts.index_select(0, owner)
            valid = lens.index_select(0, owner) - index_in_seq * block_size
            offsets = torch.arange(block_size, device=ids.device).unsqueeze(0)
            mask = torch.zeros(ids.shape[0], block_size, device=ids.device)
            mask = mask.masked_fill(offsets >= valid.unsqueeze(1), float("-inf")).view(-1, 1, 1, block_size)
            self._gather = (ids, owner, mask)
        return self._gather


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    k_cache[meta.slot_blocks, :, meta.slot_offsets] = k
    v_cache[meta.slot_blocks, :, meta.slot_offsets] = v


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float, kv_written: bool = False,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D] (this step's tokens). Returns [T, H, D].
    `kv_written`: k and v are already in the caches (the fused RoPE kernel wrote them)."""
    if not kv_written:
        write_kv(k, v, k_cache, v_cache, meta)
    if meta.num_decodes == q.shape[0]:
        return decode_attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.num_decodes:
        out[: meta.num_decodes] = decode_attention(q[: meta.num_decodes], k_cache, v_cache, meta, scale)
    fast_prefill = prefill_kernels(q, k)
    for span in meta.prefills:
        s, n = span.start, span.num_tokens
        qs = q[s : s + n]
        if fast_prefill is not None:
            ks, vs = k[s : s + n], v[s : s + n]
            if span.block_table is not None:  # prior context, then the chunk, from the pool
                ks = _gather_context(k_cache, span)[0].transpose(0, 1)  # token-major rows
                vs = _gather_context(v_cache, span)[0].transpose(0, 1)
            out[s : s + n] = fast_prefill.prefill_attention(qs, ks, vs, scale)
            continue
        qs = qs.transpose(0, 1).unsqueeze(0)
        if span.block_table is None:
            ks = k[s : s + n].transpose(0, 1).unsqueeze(0)
            vs = v[s : s + n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            ks = _gather_context(k_cache, span)
            vs = _gather_context(v_cache, span)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=span.mask, scale=scale, enable_gqa=True)
        out[s : s + n] = o[0].transpose(0, 1)
    return out


def _gather_context(cache: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
    blocks = cache.index_select(0, span.block_table)  # [nb, KVH, bs, D]
    nb, kvh, bs, d = blocks.shape
    return blocks.transpose(0, 1).reshape(kvh, nb * bs, d)[:, : span.context_len].unsqueeze(0)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """One query per sequence, over all of its cached tokens."""
    ops = paged_kernels(q, k_cache, v_cache)
    if ops:
        return ops.paged_decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale)
    return decode_attention_torch(q, k_cache, v_cache, meta, scale)


def prefill_kernels(q: torch.Tensor, k: torch.Tensor) -> ModuleType | None:
    """The C++ kernels when their prefill attention takes these chunks: float32 on a CPU
    build with AVX-512, bfloat16 with AVX-512 BF16, in the head shapes the kernel says it
    runs."""
    ops = kernels.for_tensor(q)
    if ops is None or not ops.prefill_attention_takes(q, k):
        return None
    return ops


def paged_kernels(t: torch.Tensor, k_cache, v_cache) -> ModuleType | None:
    """The C++ CPU kernels, when they can run on these tensors: `t` on the CPU and the caches
    plain tensors of its dtype (a quantized KV pool is an object that dequantizes on read, so
    it takes the PyTorch paths)."""
    if type(k_cache) is torch.Tensor and type(v_cache) is torch.Tensor and k_cache.dtype == t.dtype:
        return kernels.for_tensor(t)
    return None


def decode_attention_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """The PyTorch decode path: gather all blocks, then a segmented softmax over them."""
    b, h, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    block_ids, owner, mask = meta.decode_gather(k_cache.shape[2])
    # index_select: an order of magnitude faster than advanced indexing on CPU.
    keys = k_cache.index_select(0, block_ids)  # [NB, KVH, bs, D]
    values = v_cache.index_select(0, block_ids)
    qb = q.view(b, kvh, g, d).index_select(0, owner)  # [NB, KVH, G, D]
    scores = torch.matmul(qb, keys.transpose(-1, -2)).float() * scale + mask
    block_max = scores.amax(-1)  # [NB, KVH, G]
    seq_max = torch.full((b, kvh, g), float("-inf"), dtype=torch.float32, device=q.device)
    seq_max.scatter_reduce_(0, owner.view(-1, 1, 1).expand_as(block_max), block_max, "amax")
    probs = torch.exp(scores - seq_max.index_select(0, owner).unsqueeze(-1))
    denom = torch.zeros((b, kvh, g), dtype=torch.float32, device=q.device)
    denom.index_add_(0, owner, probs.sum(-1))
    block_out = torch.matmul(probs.to(values.dtype), values)  # [NB, KVH, G, D]
    out = torch.zeros((b, kvh, g, d), dtype=torch.float32, device=q.device)
    out.index_add_(0, owner, block_out.float())
    out = out / denom.unsqueeze(-1)
    return out.view(b, h, d).to(q.dtype)
