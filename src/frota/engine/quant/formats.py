"""Quantized weight formats: quantize, dequantize and the packed int4 layout.

Three weight-only formats, each a small dataclass of tensors:

- `Int8Weight`: symmetric int8, one float32 scale per output channel
  (`group_size=None`) or per group of `group_size` input elements (GGUF Q8_0
  maps here with groups of 32). w = q * scale.
- `Int4Weight`: group-wise int4, packed two per byte, w = (q - 8) * scale + zero
  with q in [0, 15]. A symmetric weight has `zeros=None` (zero = 0). This is
  the formula torch's int4 matmul kernels implement, so a weight goes to the
  kernel without re-rounding; GGUF Q4_0 (zero = 0) and Q4_1 (zero = m + 8d)
  map onto it exactly.
- `Fp8Weight`: float8 e4m3 with one float32 scale per output channel or one
  per tensor. w = q * scale.

The packed int4 layout is row-major `[out, in // 2]` uint8: element `2i` in
the low nibble of byte `i`, element `2i + 1` in the high nibble. The kernels'
own tiled layouts are derived from it in `linear.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from frota.engine.quant.config import INT4_GROUP_SIZES

FP8_E4M3_MAX = 448.0


@dataclass
class Int8Weight:
    """Symmetric int8 weight `[out, in]` with per-channel or group-wise float32 scales."""

    qweight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # float32 [out] (per channel) or [out, in // group_size]
    group_size: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[0], self.qweight.shape[1])

    def nbytes(self) -> int:
        return _nbytes(self.qweight, self.scales)


@dataclass
class Int4Weight:
    """Group-wise int4 weight `[out, in]`, packed two per byte; w = (q - 8) * scale + zero."""

    packed: torch.Tensor  # uint8 [out, in // 2]
    scales: torch.Tensor  # float32 [out, in // group_size]
    zeros: torch.Tensor | None  # float32 [out, in // group_size]; None: symmetric
    group_size: int = 32

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    def nbytes(self) -> int:
        return _nbytes(self.packed, self.scales, self.zeros)


@dataclass
class Fp8Weight:
    """float8 e4m3 weight `[out, in]` with a float32 scale per channel `[out]` or per tensor `[]`."""

    qweight: torch.Tensor  # float8_e4m3fn [out, in]
    scales: torch.Tensor  # float32 [out] or []

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[0], self.qweight.shape[1])

    def nbytes(self) -> int:
        return _nbytes(self.qweight, self.scales)


QuantizedWeight = Int8Weight | Int4Weight | Fp8Weight


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(
            f"in_features {in_features} is not a multiple of group_size {group_size}; "
            "choose a group size that divides the layer's input dimension"
        )
    return w.reshape(out_features, in_features // group_size, group_size)


# ---------------------------------------------------------------- int8


def quantize_int8(w: torch.Tensor, group_size: int | None = None) -> Int8Weight:
    """Round `w` `[out, in]` to symmetric int8 (per channel, or per group of `group_size`).

    The error of each element is at most half its scale (absmax / 127 / 2).
    """
    w = w.detach().float()
    if group_size is None:
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return Int8Weight(q, scales, None)
    g = _grouped(w, group_size)
    scales = (g.abs().amax(dim=2) / 127.0).clamp(min=1e-12)
    q = torch.round(g / scales[:, :, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q.reshape(w.shape), scales, group_size)


def dequantize_int8(qw: Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight `[out, in]` an `Int8Weight` stands for."""
    q = qw.qweight.float()
    if qw.group_size is None:
        return (q * qw.scales.float()[:, None]).to(dtype)
    g = _grouped(q, qw.group_size) * qw.scales.float()[:, :, None]
    return g.reshape(q.shape).to(dtype)


# ---------------------------------------------------------------- int4


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack `[out, in]` values in [0, 15] two per byte: element 2i low nibble, 2i+1 high."""
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even number of columns, got {q.shape[-1]}")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 `[out, in // 2]` -> uint8 values in [0, 15], `[out, in]`."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_int4(w: torch.Tensor, group_size: int = 32, symmetric: bool = False) -> Int4Weight:
    """Round `w` `[out, in]` to group-wise int4.

    Asymmetric (the default) spends the 16 levels on [min, max] of each group;
    symmetric spends them on [-absmax, absmax] with no zero point stored. Either
    way the error of each element is at most half its group's scale.
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    w = w.detach().float()
    g = _grouped(w, group_size)
    if symmetric:
        # (q - 8) spans [-8, 7]; [-7, 7] keeps the grid symmetric, so zero is 0
        scales = (g.abs().amax(dim=2) / 7.0).clamp(min=1e-12)
        q = (torch.round(g / scales[:, :, None]) + 8).clamp(1, 15)
        q = q.to(torch.uint8).reshape(w.shape)
        return Int4Weight(pack_int4(q), scales, None, group_size)
    lo = g.amin(dim=2)
    hi = g.amax(dim=2)
    scales = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[:, :, None]) / scales[:, :, None]).clamp(0, 15)
    zeros = lo + 8.0 * scales
    q = q.to(torch.uint8).reshape(w.shape)
    return Int4Weight(pack_int4(q), scales, zeros, group_size)


def dequantize_int4(qw: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight `[out, in]` an `Int4Weight` stands for: (q - 8) * scale + zero."""
    q = unpack_int4(qw.packed).float()
    g = _grouped(q, qw.group_size) - 8.0
    g = g * qw.scales.float()[:, :, None]
    if qw.zeros is not None:
        g = g + qw.zeros.float()[:, :, None]
    return g.reshape(q.shape).to(dtype)


# ---------------------------------------------------------------- fp8


def quantize_fp8(w: torch.Tensor, per_channel: bool = True) -> Fp8Weight:
    """Scale `w` `[out, in]` into float8 e4m3's range (per channel or per tensor) and cast."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax()
    scales = (amax / FP8_E4M3_MAX).clamp(min=1e-12)
    s = scales[:, None] if per_channel else scales
    q = (w / s).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q, scales)


def dequantize_fp8(qw: Fp8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight `[out, in]` an `Fp8Weight` stands for."""
    s = qw.scales.float()
    s = s[:, None] if s.dim() == 1 else s
    return (qw.qweight.float() * s).to(dtype)


_DEQUANTIZERS: dict[type, Callable[..., torch.Tensor]] = {
    Int8Weight: dequantize_int8, Int4Weight: dequantize_int4, Fp8Weight: dequantize_fp8}


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize any of the formats."""
    return _DEQUANTIZERS[type(qw)](qw, dtype)


def quantize(
    w: torch.Tensor, method: str, group_size: int = 32, symmetric: bool = False
) -> QuantizedWeight:
    """Quantize `w` with `method` in {"int8", "int4", "fp8"} (int8 is per channel)."""
    if method == "int8":
        return quantize_int8(w)
    if method == "int4":
        return quantize_int4(w, group_size, symmetric)
    if method == "fp8":
        return quantize_fp8(w)
    raise ValueError(f"unknown quantization {method!r}; expected one of int8, int4, fp8")
