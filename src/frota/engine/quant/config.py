"""What quantization the user asked for (torch-free: the planner-facing names live in
`frota.api.memory`)."""

from __future__ import annotations

from dataclasses import dataclass

from frota.api.memory import KV_CACHE_DTYPES, QUANTIZATIONS

INT4_GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantConfig:
    """Weight quantization of a model.

    - `method`: none | int8 (per-channel) | int4 (group-wise) | fp8 (e4m3, per-channel).
    - `group_size`, `symmetric`: int4's group and whether it stores zero points.
    - `quantize_lm_head`: quantize the LM head too (a tied embedding then reads
      the same int8 storage, so it is quantized with it).
    - `native_gguf`: keep a GGUF's Q4_0/Q4_1 tensors as int4 group-32 when int4
      is asked for, and its Q8_0 tensors as int8 group-32 when int8 or int4 is:
      those keep exactly what the file holds. Other tensors are quantized from
      their dequantized floats.
    """

    method: str = "none"
    group_size: int = 32
    symmetric: bool = False
    quantize_lm_head: bool = True
    native_gguf: bool = True

    def __post_init__(self) -> None:
        if self.method not in QUANTIZATIONS:
            raise ValueError(
                f"quantization {self.method!r}: use one of {', '.join(QUANTIZATIONS)}"
            )
        if self.group_size not in INT4_GROUP_SIZES:
            raise ValueError(
                f"int4 group size {self.group_size}: use one of {INT4_GROUP_SIZES}"
            )

    @property
    def enabled(self) -> bool:
        return self.method != "none"


def validate_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """Return `kv_cache_dtype` or raise a ValueError that lists the choices."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    return kv_cache_dtype
