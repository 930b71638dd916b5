"""Paged attention in plain PyTorch.

The KV pool of one layer is `[num_blocks, num_kv_heads, block_size, head_dim]`.
New keys and values are written into it through `slot_mapping`. Queries come as
one flat, unpadded token stream: first one token per decoding sequence, then the
chunks of sequences in prefill.

- Decode: all decoding sequences at once, block by block. The blocks of every
  sequence are gathered into one `[num_blocks_total, ...]` batch, scores are
  computed per block with one batched matmul, and a segmented softmax (max and
  sum reduced per sequence with scatter/index_add) combines the blocks. The
  only slots computed beyond a sequence's length are those of its last,
  partly filled block; nothing is padded to the longest sequence.
- Prefill: one SDPA call per sequence chunk; a chunk with prior context (an
  earlier chunk, or a prefix-cache hit) reads that context through its block
  table, with the causal mask shifted by the context length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One sequence's chunk in the flat token stream."""

    start: int  # first token of the chunk in the stream
    num_tokens: int
    context_len: int  # tokens with KV after this step (prior context + the chunk)
    block_table: torch.Tensor | None  # set when there is prior context to read
    mask: torch.Tensor | None  # [num_tokens, context_len] bool, when there is prior context


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step, shared by all layers."""

    slot_blocks: torch.Tensor  # [T] block of each new token's slot
    slot_offsets: torch.Tensor  # [T] offset inside that block
    num_decodes: int = 0
    decode_block_ids: torch.Tensor | None = None  # [NB] blocks of all decoding sequences
    decode_block_owner: torch.Tensor | None = None  # [NB] which decoding sequence owns each
    decode_mask: torch.Tensor | None = None  # [NB, 1, 1, block_size] 0 or -inf
    prefills: list[PrefillSpan] = field(default_factory=list)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    k_cache[meta.slot_blocks, :, meta.slot_offsets] = k
    v_cache[meta.slot_blocks, :, meta.slot_offsets] = v


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: AttentionMetadata, scale: float,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D] (this step's tokens). Returns [T, H, D]."""
    write_kv(k, v, k_cache, v_cache, meta)
    if meta.num_decodes == q.shape[0]:
        return decode_attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.num_decodes:
        out[: meta.num_decodes] = decode_attention(q[: meta.num_decodes], k_cache, v_cache, meta, scale)
    for span in meta.prefills:
        s, n = span.start, span.num_tokens
        qs = q[s : s + n].transpose(0, 1).unsqueeze(0)
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
    """One query per sequence, over all of its cached blocks: a segmented softmax."""
    b, h, d = q.shape
    kvh = k_cache.shape[1]
    g = h // kvh
    owner = meta.decode_block_owner
    # index_select: an order of magnitude faster than advanced indexing on CPU.
    keys = k_cache.index_select(0, meta.decode_block_ids)  # [NB, KVH, bs, D]
    values = v_cache.index_select(0, meta.decode_block_ids)
    qb = q.view(b, kvh, g, d).index_select(0, owner)  # [NB, KVH, G, D]
    scores = torch.matmul(qb, keys.transpose(-1, -2)).float() * scale + meta.decode_mask
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
