"""Memory accounting: bytes of weights and of KV cache per token. Pure arithmetic, no torch.

The one owner of these numbers: the planner (`frota.plan`) sizes replicas with them
(per rank, over tensor and pipeline parallel sizes) and the engine sizes its KV
block pool with them, so the plan and the pool agree. Bytes as the engine stores
them (`frota.engine.quant.formats` and `frota.engine.quant.kv`):

- float32 4, bfloat16/float16 2 bytes per weight;
- int8: 1 byte per weight + a float32 scale per output channel (or per group);
- int4: half a byte per weight + float32 scale and zero per group
  (a symmetric weight stores the zeros too, as zeros: the kernels need them);
- fp8: 1 byte per weight + a float32 scale per output channel.

KV: `auto` stores K and V in the model dtype; `int8`/`fp8` store 1 byte per
element plus a float16 scale per (token, head).

LoRA: one adapter slot holds A and B of every target projection at the pool's max rank,
in the model dtype (`lora_slot_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The names spec.engine and `frota worker` take (the planner sets the worker's from the spec's),
# as types for the spec's fields and as tuples for flags and checks.
# A dtype: DTYPE_BYTES's, or auto (the engine picks bfloat16 where the hardware computes it).
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
WeightQuantization = Literal["none", "int8", "int4", "fp8"]
KVCacheDtype = Literal["auto", "int8", "fp8"]  # auto: K and V in the model dtype
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
QUANTIZATIONS: tuple[WeightQuantization, ...] = get_args(WeightQuantization)
KV_CACHE_DTYPES: tuple[KVCacheDtype, ...] = get_args(KVCacheDtype)
SCALE_BYTES = 4  # float32 weight scales and zeros
KV_SCALE_BYTES = 2  # float16 per (token, head)


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of a float `dtype` ("float32", "bfloat16", "float16")."""
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
    """Bytes of one `[out, in]` weight stored as `quantization` (none keeps `dtype`).

    int4 counts a trailing partial group whole (the engine refuses such a shape,
    but a plan of one should not crash the planner).
    """
    n = out_features * in_features
    if quantization == "none":
        return n * dtype_bytes(dtype)
    if quantization == "int8":
        groups = 1 if int8_group_size is None else in_features // int8_group_size
        return n + out_features * groups * SCALE_BYTES
    if quantization == "int4":
        groups = -(-in_features // group_size)
        return n // 2 + out_features * groups * 2 * SCALE_BYTES
    if quantization == "fp8":
        return n + out_features * SCALE_BYTES
    raise ValueError(f"quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)}")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family model (dense or MoE): what its bytes and its sharding
    follow from.

    Declared once: the planner's table of known models (`frota.plan.model_shapes`), this
    accounting and the engine's `ModelConfig`, which adds what only the forward pass reads,
    are all this shape. `intermediate_size` is each expert's when `num_experts` > 0.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 0  # 0: dense feed-forward
    num_experts_per_tok: int = 2
    max_position: int = 2048  # the context, in tokens (HF's max_position_embeddings)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def weight_bytes_per_stage(
    shape: ModelShape,
    quantization: str = "none",
    dtype: str = "bfloat16",
    *,
    tensor: int = 1,
    pipeline: int = 1,
    group_size: int = 32,
    quantize_lm_head: bool = True,
) -> list[int]:
    """Weight bytes of one rank in each pipeline stage.

    Linears are stored as `quantization` and split over `tensor` ranks (KV heads are
    replicated when there are fewer than ranks, the vocabulary is split rounding up);
    norms, the MoE router and the embedding stay in `dtype`. Stage 0 holds the embedding,
    the last stage the LM head and the final norm. An LM head tied to the embedding on
    the same rank is the embedding (one copy), except as int4: its kernel layout cannot
    be gathered by row, so the embedding keeps its floats.
    """
    h, elem = shape.hidden_size, dtype_bytes(dtype)
    qkv, o, gate_up, down = (linear_weight_bytes(out_features, in_features, quantization, dtype, group_size)
                             for out_features, in_features in layer_projections(shape, tensor))
    attn, mlp = qkv + o, gate_up + down
    if shape.num_experts:
        # every expert, each split over the tensor ranks; the router gate stays float
        mlp = shape.num_experts * mlp + linear_weight_bytes(shape.num_experts, h, "none", dtype)
    per_layer = attn + mlp + 2 * h * elem  # + input and post-attention norms
    num_layers = -(-shape.num_layers // pipeline)
    vocab = -(-shape.vocab_size // tensor)
    head_quant = quantization if quantize_lm_head else "none"
    lm_head = linear_weight_bytes(vocab, h, head_quant, dtype, group_size)
    embedding = vocab * h * elem
    shared = shape.tie_word_embeddings and pipeline == 1 and head_quant != "int4"
    stages = [num_layers * per_layer for _ in range(pipeline)]
    stages[0] += 0 if shared else embedding
    stages[-1] += lm_head + h * elem  # + the final norm
    return stages


def layer_projections(shape: ModelShape, tensor: int = 1) -> list[tuple[int, int]]:
    """(out_features, in_features) of one layer's projections on one of `tensor` ranks: the
    fused qkv, o, the fused gate_up and down (one expert's for a mixture of experts)."""
    h = shape.hidden_size
    q = shape.num_heads // tensor * shape.head_dim
    kv = max(1, shape.num_kv_heads // tensor) * shape.head_dim
    ff = shape.intermediate_size // tensor
    return [(q + 2 * kv, h), (h, q), (2 * ff, h), (h, ff)]


def cpu_second_layout_bytes(shape: ModelShape, quantization: str = "none", dtype: str = "bfloat16") -> int:
    """Bytes a Frota CPU worker may hold besides its weights: on a CPU with AMX tiles, each
    bfloat16 projection of an unsharded dense model but the LM head is also kept in oneDNN's
    layout, for prefill chunks of over 256 rows (`frota.engine.kernels.linear.AmxLinear`).
    Zero for other dtypes, quantized weights and mixtures of experts."""
    if dtype != "bfloat16" or quantization != "none" or shape.num_experts:
        return 0
    per_layer = sum(out_features * in_features for out_features, in_features in layer_projections(shape))
    return shape.num_layers * per_layer * dtype_bytes(dtype)


def model_weight_bytes(
    shape: ModelShape,
    quantization: str = "none",
    dtype: str = "bfloat16",
    group_size: int = 32,
    quantize_lm_head: bool = True,
) -> int:
    """Bytes of all weights of an unsharded model (`weight_bytes_per_stage` on one rank)."""
    (total,) = weight_bytes_per_stage(shape, quantization, dtype, group_size=group_size,
                                      quantize_lm_head=quantize_lm_head)
    return total


def kv_bytes_per_token(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = "auto",
    dtype: str = "bfloat16",
    *,
    tensor: int = 1,
    pipeline: int = 1,
) -> int:
    """Bytes of K and V for one token on one rank: every layer of its pipeline stage, its
    share of the KV heads over `tensor` ranks (one head each when there are fewer heads)."""
    if kv_cache_dtype == "auto":
        per_head = head_dim * dtype_bytes(dtype)
    elif kv_cache_dtype in ("int8", "fp8"):
        per_head = head_dim + KV_SCALE_BYTES
    else:
        raise ValueError(
            f"kv cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    num_layers = -(-num_layers // pipeline)
    num_kv_heads = max(1, num_kv_heads // tensor)
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


# PEFT names of the projections a LoRA adapter may target; a slot holds all of them
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the row-parallel projections: their input is split over tensor ranks, their output whole
LORA_ROW_PARALLEL = ("o_proj", "down_proj")


def lora_module_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each LoRA target projection of one layer, unsharded.

    A mixture of experts is targeted on its attention projections only: its experts'
    feed-forward projections are not LoRA targets (as in vLLM's default), so they hold no slot.
    """
    h = shape.hidden_size
    q = shape.num_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    modules = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    if not shape.is_moe:
        ff = shape.intermediate_size
        modules |= {"gate_proj": (ff, h), "up_proj": (ff, h), "down_proj": (h, ff)}
    return modules


def lora_slot_bytes(shape: ModelShape, max_rank: int, dtype: str, tensor: int = 1, *,
                    pipeline: int = 1) -> int:
    """Bytes of one adapter slot on one rank: LoRA A `[r, in]` and B `[out, r]` at rank
    `max_rank` for every target module of every layer of its pipeline stage, in `dtype`.

    Over `tensor` ranks a slot is split as the base projection is: a column-parallel
    projection (q, k, v, gate, up) keeps A whole and shards B's rows; a row-parallel one
    (o, down) shards A's columns and keeps B whole. KV heads are replicated when there are
    fewer than ranks, as in `layer_projections`. The planner reserves `maxAdapters` of these
    per rank and the engine's slot pool allocates the same, so the two agree.
    """
    if max_rank < 1:
        raise ValueError(f"LoRA rank {max_rank}: use a rank of 1 or more")
    elem = dtype_bytes(dtype)
    kv_per_rank = max(1, shape.num_kv_heads // tensor) * shape.head_dim
    per_layer = 0
    for name, (out_features, in_features) in lora_module_shapes(shape).items():
        if name in LORA_ROW_PARALLEL:
            in_features //= tensor
        elif name in ("k_proj", "v_proj"):
            out_features = kv_per_rank
        else:
            out_features //= tensor
        per_layer += max_rank * (in_features + out_features)
    num_layers = -(-shape.num_layers // pipeline)
    return num_layers * per_layer * elem
