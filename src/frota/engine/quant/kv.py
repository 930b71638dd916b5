"""Quantized KV cache storage: int8 or fp8 values with a scale per token and head.

A `QuantizedKVCache` stands in for one layer's float pool tensor
`[num_blocks, num_kv_heads, block_size, head_dim]`: writing into it
(`cache[blocks, :, offsets] = k`) quantizes, reading from it (`cache[ids]`)
dequantizes into the compute dtype, so attention code written against a float
pool works on it unchanged. Each (token, head) row keeps one float16 scale, so
a head of dimension 64 costs 66 bytes instead of bfloat16's 128.
"""

from __future__ import annotations

from typing import Any

import torch

from frota.api.memory import KV_CACHE_DTYPES
from frota.engine.quant.formats import FP8_E4M3_MAX

SCALE_DTYPE = torch.float16
_STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
_QMAX = {"int8": 127.0, "fp8": FP8_E4M3_MAX}
_MIN_SCALE = 1e-7  # above float16's smallest subnormal; tinier rows are zeros anyway


def quantize_kv(x: torch.Tensor, kind: str = "int8") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x` `[..., head_dim]` with one scale per leading index (token, head).

    Returns (values `[..., head_dim]` int8 or float8_e4m3fn, scales `[...]` float16).
    int8's error per element is at most half a scale (absmax / 254), plus the
    float16 rounding of the scale itself.
    """
    qmax = _QMAX[kind]
    xf = x.float()
    scales = (xf.abs().amax(dim=-1) / qmax).clamp(min=_MIN_SCALE).to(SCALE_DTYPE)
    scaled = xf / scales.float().unsqueeze(-1)
    if kind == "int8":
        values = torch.round(scaled).clamp(-127, 127).to(torch.int8)
    else:
        values = scaled.clamp(-qmax, qmax).to(torch.float8_e4m3fn)
    return values, scales


def dequantize_kv(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `quantize_kv`, into `dtype`."""
    return (values.to(torch.float32) * scales.to(torch.float32).unsqueeze(-1)).to(dtype)


class QuantizedKVCache:
    """One layer's K (or V) pool, stored quantized, indexed like the float pool tensor."""

    def __init__(
        self,
        num_blocks: int,
        num_kv_heads: int,
        block_size: int,
        head_dim: int,
        kind: str,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if kind not in _STORAGE:
            raise ValueError(f"kv cache dtype {kind!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
        self.kind = kind
        self.dtype = dtype  # what reads return: the model's compute dtype
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.values = torch.zeros(shape, dtype=_STORAGE[kind], device=device)
        self.scales = torch.zeros(shape[:-1], dtype=SCALE_DTYPE, device=device)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    def dim(self) -> int:
        return self.values.dim()

    def size(self, dim: int | None = None) -> Any:
        return self.values.shape if dim is None else self.values.shape[dim]

    def nbytes(self) -> int:
        return (
            self.values.numel() * self.values.element_size()
            + self.scales.numel() * self.scales.element_size()
        )

    def __setitem__(self, index: Any, x: torch.Tensor) -> None:
        values, scales = quantize_kv(x, self.kind)
        self.values[index] = values
        self.scales[index] = scales

    def __getitem__(self, index: Any) -> torch.Tensor:
        return dequantize_kv(self.values[index], self.scales[index], self.dtype)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        return dequantize_kv(
            self.values.index_select(dim, index), self.scales.index_select(dim, index), self.dtype
        )

    def zero_(self) -> QuantizedKVCache:
        self.values.zero_()
        self.scales.zero_()
        return self


def allocate_kv_pool(
    num_layers: int,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int,
    kv_cache_dtype: str,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[tuple[Any, Any]]:
    """Per-layer (K, V) pools: float tensors for "auto", `QuantizedKVCache` for int8/fp8."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"kv cache dtype {kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    pools: list[tuple[Any, Any]] = []
    for _ in range(num_layers):
        if kv_cache_dtype == "auto":
            pools.append(
                (
                    torch.zeros(shape, dtype=dtype, device=device),
                    torch.zeros(shape, dtype=dtype, device=device),
                )
            )
        else:
            pools.append(
                (
                    QuantizedKVCache(*shape, kind=kv_cache_dtype, dtype=dtype, device=device),
                    QuantizedKVCache(*shape, kind=kv_cache_dtype, dtype=dtype, device=device),
                )
            )
    return pools
