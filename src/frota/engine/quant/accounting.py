"""The engine's name for `frota.api.memory`, the one owner of weight and KV-cache bytes.

Kept so `frota.engine.quant.accounting` imports keep working; the numbers are
defined in `frota.api.memory` (torch-free), which the operator's planner uses too.
"""

from __future__ import annotations

from frota.api.memory import (
    DTYPE_BYTES,
    KV_CACHE_DTYPES,
    KV_SCALE_BYTES,
    QUANTIZATIONS,
    SCALE_BYTES,
    ModelShape,
    dtype_bytes,
    kv_bytes_per_token,
    linear_weight_bytes,
    model_weight_bytes,
    num_kv_blocks,
    weight_bytes_per_stage,
)

__all__ = [
    "DTYPE_BYTES",
    "KV_CACHE_DTYPES",
    "KV_SCALE_BYTES",
    "QUANTIZATIONS",
    "SCALE_BYTES",
    "ModelShape",
    "dtype_bytes",
    "kv_bytes_per_token",
    "linear_weight_bytes",
    "model_weight_bytes",
    "num_kv_blocks",
    "weight_bytes_per_stage",
]
