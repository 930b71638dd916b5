"""Memory accounting for quantized weights and KV caches: pure arithmetic, no torch.

The planner (operator image, no torch) imports this module to size replicas;
the engine uses the same numbers to size its KV block pool, so both agree.
Formats and their bytes:

- float32 4, bfloat16/float16 2 bytes per weight;
- int8: 1 byte per weight + a float32 scale per output channel (or per group);
- int4: half a byte per weight + float32 scale and zero per group
  (a symmetric weight stores the zeros too, as zeros: the kernels need them);
- fp8: 1 byte per weight + a float32 scale per output channel.

KV: `auto` stores K and V in the model dtype; `int8`/`fp8` store 1 byte per
element plus a float16 scale per (token, head).
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QUANTIZATIONS = ("none", "int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCALE_BYTES = 4  # float32 weight scales and zeros
KV_SCALE_BYTES = 2  # float16 per (token, head)


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def linear_weight_bytes(
    out_features: int,
    in_features: int,
    quantization: str = "none",
    dtype: str = "bfloat16",
    group_size: int = 32,
    int8_group_size: int | None = None,
) -> int:
    """Bytes of one `[out, in]` weight stored as `quantization` (none keeps `dtype`)."""
    n = out_features * in_features
    if quantization == "none":
        return n * _dtype_bytes(dtype)
    if quantization == "int8":
        groups = 1 if int8_group_size is None else in_features // int8_group_size
        return n + out_features * groups * SCALE_BYTES
    if quantization == "int4":
        if in_features % group_size:
            raise ValueError(f"in_features {in_features} is not a multiple of group {group_size}")
        return n // 2 + out_features * (in_features // group_size) * 2 * SCALE_BYTES
    if quantization == "fp8":
        return n + out_features * SCALE_BYTES
    raise ValueError(f"quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)}")


@dataclass(frozen=True)
class ModelShape:
    """What the accounting needs of a Llama-family model (dense or MoE)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 0


def model_weight_bytes(
    shape: ModelShape,
    quantization: str = "none",
    dtype: str = "bfloat16",
    group_size: int = 32,
    quantize_lm_head: bool = True,
) -> int:
    """Bytes of all weights: linears as `quantization`, norms and (untied) embedding in `dtype`.

    A quantized LM head tied to the embedding serves as the embedding too (one copy).
    """
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    q = shape.num_heads * shape.head_dim
    ff = shape.intermediate_size

    def lin(o: int, i: int) -> int:
        return linear_weight_bytes(o, i, quantization, dtype, group_size)

    attn = lin(q + 2 * kv, h) + lin(h, q)
    if shape.num_experts:
        mlp = shape.num_experts * (lin(2 * ff, h) + lin(h, ff))
        mlp += linear_weight_bytes(shape.num_experts, h, "none", dtype)  # the router stays float
    else:
        mlp = lin(2 * ff, h) + lin(h, ff)
    norms = (2 * shape.num_layers + 1) * h * _dtype_bytes(dtype)
    head_quant = quantization if quantize_lm_head else "none"
    lm_head = linear_weight_bytes(shape.vocab_size, h, head_quant, dtype, group_size)
    embed = shape.vocab_size * h * _dtype_bytes(dtype)
    if shape.tie_word_embeddings:
        embed = 0 if head_quant != "int4" else embed  # int4 kernels can't be gathered by row
    return shape.num_layers * (attn + mlp) + norms + lm_head + embed


def kv_bytes_per_token(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = "auto",
    dtype: str = "bfloat16",
) -> int:
    """Bytes of K and V for one token across all layers."""
    if kv_cache_dtype == "auto":
        per_head = head_dim * _dtype_bytes(dtype)
    elif kv_cache_dtype in ("int8", "fp8"):
        per_head = head_dim + KV_SCALE_BYTES
    else:
        raise ValueError(
            f"kv cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    return 2 * num_layers * num_kv_heads * per_head


def num_kv_blocks(
    memory_bytes: int,
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = "auto",
    dtype: str = "bfloat16",
) -> int:
    """How many KV blocks of `block_size` tokens fit in `memory_bytes`."""
    per_block = block_size * kv_bytes_per_token(
        num_layers, num_kv_heads, head_dim, kv_cache_dtype, dtype
    )
    return max(0, memory_bytes // per_block)
