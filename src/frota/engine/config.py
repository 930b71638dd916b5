"""Engine arguments (what the user asks for) and model config (what the weights are)."""

from __future__ import annotations

from dataclasses import dataclass

from frota.api.contract import ModelAlias
from frota.api.memory import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, ModelShape


def _choices(names: tuple[str, ...]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass
class EngineArgs:
    """Everything needed to build an engine; see docs/internals.md."""

    model: str = ModelAlias.SMOLLM2
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    verbose: bool = True  # print loading progress
    quantization: str = "none"  # none | int8 | int4 | fp8 (weights; see frota.engine.quant)
    kv_cache_dtype: str = "auto"  # auto (the model dtype) | int8 | fp8
    # Parallelism across processes (frota.engine.parallel); rank and master come from FROTA_* env.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    expert_capacity_factor: float | None = None  # MoE: None never drops a token
    # LoRA (frota.engine.lora): slots for this many resident adapters, each up to this rank;
    # 0 turns LoRA off (no slots allocated, no wrapper installed)
    max_loras: int = 0
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0 (0 turns LoRA off)")
        if self.max_lora_rank < 1:
            raise ValueError("max_lora_rank must be >= 1")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: use {_choices(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization {self.quantization!r}: use {_choices(QUANTIZATIONS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r}: "
                             f"use {_choices(KV_CACHE_DTYPES)}")
        sharded = self.tensor_parallel_size * self.pipeline_parallel_size * self.expert_parallel_size
        if sharded > 1 and (self.quantization != "none" or self.kv_cache_dtype != "auto"):
            raise ValueError("quantization and kv_cache_dtype are not supported with parallel "
                             "(sharded) engines yet: use quantization none and kv_cache_dtype auto")


@dataclass(frozen=True)
class ModelConfig(ModelShape):
    """The architecture of a Llama-family model (dense or Mixtral-style MoE): its shape, which
    the planner and the memory accounting read too, and what only the forward pass needs."""

    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
