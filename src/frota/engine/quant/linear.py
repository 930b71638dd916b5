"""Quantized linear layers: a forward that picks a fused kernel or a correct fallback.

Kernels, by device and activation dtype:

- CPU, up to `GEMV_MAX_ROWS` rows (decode), any float activations: Frota's own
  int8 / int4 kernels (`cpu_kernels`: a small C++ extension compiled on first
  use), which read each weight byte once at close to memory bandwidth and take
  int8 group scales (GGUF Q8_0) in one call. int4 then holds its weight in that
  kernel's layout (GGUF's nibble order, float16 scale and min per group when
  they are exact in float16). More rows (prefill) dequantize with the same
  extension and multiply. When the extension cannot be built (no compiler), or
  is switched off (`FROTA_CPU_KERNELS=0`, or `FROTA_QUANT_KERNELS=torch` for it
  alone), the torch ops below are used, as before.
- int8 per channel: `torch._weight_int8pack_mm` (CPU and CUDA) for bf16/fp16
  activations. On CPU its float32 path is a scalar loop, slower than
  dequantize-then-matmul, so float32 takes the fallback.
- int4 group-wise: CPU `_weight_int4pack_mm_for_cpu`, CUDA `_weight_int4pack_mm`
  (bf16 only). Both need the weight in their own tiled layout, built on the
  first forward from the canonical packing (which is then dropped, so the
  layer never holds two copies). float32 activations on CPU dequantize the
  canonical packing instead when it is still there (the fused float32 path is
  a scalar loop too); once the kernel layout exists it is used for every dtype.
- int8 group-wise (GGUF Q8_0): dequantize-then-matmul; no fused kernel takes
  group scales for int8.
- fp8 e4m3: `torch._scaled_mm` on CUDA with compute capability >= 8.9,
  dequantize-then-matmul elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from frota.engine.quant import cpu_kernels
from frota.engine.quant.formats import (
    FP8_E4M3_MAX,
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    quantize,
    unpack_int4,
)

FUSED_DTYPES = (torch.bfloat16, torch.float16)
FROTA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Rows up to which Frota's CPU kernels beat dequantize-then-GEMM (bench/quantization.py
# --kernels: at 8 rows they are even with it and with torch's int8 kernel, at 16 the
# dequantized bf16 GEMM is faster)
GEMV_MAX_ROWS = 8


def frota_kernels(device: torch.device) -> ModuleType | None:
    """Frota's compiled CPU kernels where they apply (CPU tensors), else None."""
    return cpu_kernels.kernels() if device.type == "cpu" else None


def fp8_supported(device: torch.device) -> bool:
    """True where `torch._scaled_mm` runs fp8 natively: CUDA, compute capability >= 8.9."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class QuantLinear(nn.Module):
    """A linear layer `y = x W^T + b` whose W is held quantized.

    Subclasses implement `kernel_name(x)` (which path a forward would take),
    `dequantized_weight(dtype)` (W as floats, for references and fallbacks)
    and `_matmul(x2d)`.
    """

    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self._matmul(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def kernel_name(self, x: torch.Tensor) -> str:
        raise NotImplementedError

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def weight_bytes(self) -> int:
        """Bytes the quantized weight (and its scales) occupy now."""
        return sum(b.numel() * b.element_size() for n, b in self.named_buffers() if n != "bias")

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, dtype: torch.dtype) -> None:
        """Build whatever the kernel for `dtype` activations needs, ahead of the first forward."""

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # `model.to(bfloat16)` must move quantized storage and scales, never recast them:
        # an fp8 weight would become bf16 and float32 scales would lose bits.
        before = {n: b for n, b in self._buffers.items() if b is not None and n != "bias"}
        super()._apply(fn, recurse)
        for n, old in before.items():
            new = self._buffers[n]
            if new is not None and new.dtype != old.dtype:
                self._buffers[n] = old.to(new.device)
        self._clear_caches()
        return self

    def _clear_caches(self) -> None:
        pass

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int8Linear(QuantLinear):
    """int8 weight-only linear: per-channel scales (fused kernel) or group-wise.

    Group-wise weights (GGUF Q8_0) have no fused kernel; a few rows at a time
    (decode) run the per-channel kernel once per group on a `[groups, out, group]`
    copy of the weight, which reads it once, as a fused kernel would; more rows
    (prefill) dequantize and matmul.
    """

    qweight: torch.Tensor | None
    grouped_qweight: torch.Tensor | None
    GROUPED_MAX_ROWS = 8

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None = None) -> None:
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias)
        self.group_size = weight.group_size
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("grouped_qweight", None)
        self.register_buffer("scales", weight.scales.float().contiguous())
        self._scales_cast: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def kernel_name(self, x: torch.Tensor) -> str:
        if (self.qweight is not None and x.dtype in FROTA_DTYPES
                and frota_kernels(x.device) is not None):
            return "frota_int8" if x.shape[0] <= GEMV_MAX_ROWS else "dequant"
        if x.dtype not in FUSED_DTYPES:
            return "dequant"
        if self.group_size is None:
            return "int8pack_mm"
        if x.shape[0] <= self.GROUPED_MAX_ROWS:
            return "int8pack_mm_grouped"
        return "dequant"

    def prepare(self, dtype: torch.dtype) -> None:
        if frota_kernels(self.scales.device) is not None:
            return  # Frota's kernel reads the row-major weight with its group scales
        if self.group_size is not None and dtype in FUSED_DTYPES and self.qweight is not None:
            n, k, g = self.out_features, self.in_features, self.group_size
            self.grouped_qweight = self.qweight.view(n, k // g, g).transpose(0, 1).contiguous()
            self.qweight = None  # one copy of the weight: `rows` and dequant read the grouped one

    def _q(self) -> torch.Tensor:
        """The int8 weight `[out, in]` (a view when only the grouped copy is held)."""
        if self.qweight is not None:
            return self.qweight
        assert self.grouped_qweight is not None
        return self.grouped_qweight.transpose(0, 1).reshape(self.out_features, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        ext = frota_kernels(self.scales.device)
        if ext is not None and self.qweight is not None:
            return ext.int8_dequant(self.qweight, self.scales, self.group_size or 0, dtype)
        return dequantize_int8(Int8Weight(self._q(), self.scales, self.group_size), dtype)

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows `index` of the weight (`[*index.shape, in]`): a tied embedding."""
        flat = index.reshape(-1)
        if self.grouped_qweight is not None:
            q = self.grouped_qweight[:, flat].transpose(0, 1).reshape(-1, self.in_features)
        else:
            q = self._q()[flat]
        w = Int8Weight(q, self.scales[flat], self.group_size)
        return dequantize_int8(w, dtype).reshape(*index.shape, self.in_features)

    def _scales_for(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.dtype, x.device)
        if key not in self._scales_cast:
            scales = self.scales if self.group_size is None else self.scales.t().contiguous()
            self._scales_cast[key] = scales.to(device=x.device, dtype=x.dtype)
        return self._scales_cast[key]

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel_name(x)
        if kernel == "frota_int8":
            ext = frota_kernels(x.device)
            return ext.int8_mm(x, self.qweight, self.scales, self.group_size or 0)
        if kernel == "int8pack_mm":
            return torch._weight_int8pack_mm(x.contiguous(), self._q(), self._scales_for(x))
        if kernel == "int8pack_mm_grouped":
            if self.grouped_qweight is None:
                self.prepare(x.dtype)
            return self._grouped_mm(x)
        return F.linear(x, self.dequantized_weight(x.dtype))

    def _grouped_mm(self, x: torch.Tensor) -> torch.Tensor:
        assert self.grouped_qweight is not None and self.group_size is not None
        scales = self._scales_for(x)  # [groups, out]
        xg = x.reshape(x.shape[0], -1, self.group_size).transpose(0, 1).contiguous()
        y = torch.zeros(x.shape[0], self.out_features, dtype=torch.float32, device=x.device)
        for g in range(xg.shape[0]):
            y += torch._weight_int8pack_mm(xg[g], self.grouped_qweight[g], scales[g])
        return y.to(x.dtype)

    def _clear_caches(self) -> None:
        self._scales_cast.clear()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", int8, group_size={self.group_size}"


class Int4Linear(QuantLinear):
    """Group-wise int4 weight-only linear, w = (q - 8) * scale + zero.

    The weight is held in one of three layouts, never two at once:

    - canonical (`packed`, `scales`, `zeros`: see `formats`), as built;
    - Frota's CPU kernel layout (`qs`, `d`, `m`; `cpu_kernels`): each run of
      32 elements in 16 bytes the way GGUF stores it, w = q * d + m, d and m
      float16 when that is exact (a GGUF Q4_0/Q4_1 weight), else float32;
    - torch's tiled int4 layout (`kernel_packed` with `scales`, `zeros`), where
      Frota's kernels are not available.
    """

    packed: torch.Tensor | None
    kernel_packed: torch.Tensor | None
    qs: torch.Tensor | None

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None) -> None:
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias)
        self.group_size = weight.group_size
        self.symmetric = weight.zeros is None
        self.register_buffer("packed", weight.packed.contiguous())
        self.register_buffer("scales", weight.scales.float().contiguous())
        zeros = weight.zeros if weight.zeros is not None else torch.zeros_like(weight.scales)
        self.register_buffer("zeros", zeros.float().contiguous())
        self.register_buffer("kernel_packed", None)
        self.register_buffer("qs", None)
        self.register_buffer("d", None)
        self.register_buffer("m", None)
        self._kernel_device: torch.device | None = None
        self._scales_and_zeros: dict[torch.dtype, torch.Tensor] = {}

    def _device(self) -> torch.device:
        held = self.qs if self.qs is not None else self.scales
        assert held is not None
        return held.device

    def kernel_name(self, x: torch.Tensor) -> str:
        if self.qs is not None or (
            self.packed is not None and x.device.type == "cpu"
            and frota_kernels(x.device) is not None
        ):
            if x.dtype in FROTA_DTYPES and x.shape[0] <= GEMV_MAX_ROWS \
                    and frota_kernels(x.device) is not None:
                return "frota_int4"
            return "dequant"
        if x.device.type == "cpu":
            if self.kernel_packed is not None or x.dtype in FUSED_DTYPES:
                return "int4pack_mm_cpu"
            return "dequant"
        if x.device.type == "cuda" and x.dtype == torch.bfloat16:
            return "int4pack_mm_cuda"
        return "dequant"

    def _weight(self) -> Int4Weight:
        if self.packed is None:
            raise RuntimeError("the canonical int4 packing was replaced by a kernel layout")
        assert self.scales is not None
        return Int4Weight(self.packed, self.scales, self.zeros, self.group_size)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.qs is not None:
            assert self.d is not None and self.m is not None
            ext = frota_kernels(self.qs.device)
            if ext is not None:
                return ext.int4_dequant(self.qs, self.d, self.m, self.group_size, dtype)
            return dequantize_gguf_order(self.qs, self.d, self.m, self.group_size).to(dtype)
        if self.packed is not None:
            return dequantize_int4(self._weight(), dtype)
        # Only the kernel layout is left: multiplying the identity through the
        # float32 kernel reads every weight back exactly.
        eye = torch.eye(self.in_features, dtype=torch.float32, device=self._device())
        return self._kernel_mm(eye).t().contiguous().to(dtype)

    def _scales_and_zeros_for(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._scales_and_zeros:
            # kernel layout: [in // group, out, 2] with (scale, zero)
            assert self.scales is not None and self.zeros is not None
            sz = torch.stack([self.scales.t(), self.zeros.t()], dim=-1).contiguous()
            self._scales_and_zeros[dtype] = sz.to(dtype)
        return self._scales_and_zeros[dtype]

    def _build_frota_layout(self) -> None:
        qs, d, m = to_gguf_order(self._weight())
        self.qs, self.d, self.m = qs, d, m
        self.packed = self.scales = self.zeros = None  # never hold two copies of the weight

    def _build_kernel_layout(self, device: torch.device) -> None:
        q = unpack_int4(self._weight().packed).to(torch.int32)
        if device.type == "cpu":
            kernel = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        else:  # CUDA's packer takes uint8 with the even element in the high nibble
            q = q.to(device)
            hi_first = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8)
            kernel = torch._convert_weight_to_int4pack(hi_first, 8)
        self.kernel_packed = kernel
        self._kernel_device = device
        self.packed = None  # never hold two copies of the weight

    def _kernel_mm(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_packed is None:
            self._build_kernel_layout(x.device)
        sz = self._scales_and_zeros_for(x.dtype).to(x.device)
        if x.device.type == "cpu":
            return torch._weight_int4pack_mm_for_cpu(
                x.contiguous(), self.kernel_packed, self.group_size, sz
            )
        return torch._weight_int4pack_mm(x.contiguous(), self.kernel_packed, self.group_size, sz)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel_name(x)
        if kernel == "frota_int4":
            if self.qs is None:
                self._build_frota_layout()
            return frota_kernels(x.device).int4_mm(x, self.qs, self.d, self.m, self.group_size)
        if kernel == "dequant":
            return F.linear(x, self.dequantized_weight(x.dtype))
        return self._kernel_mm(x)

    def prepare(self, dtype: torch.dtype) -> None:
        if self.packed is None:
            return
        device = self._device()
        if frota_kernels(device) is not None:
            self._build_frota_layout()
        elif dtype in FUSED_DTYPES and (
            device.type == "cpu" or (device.type == "cuda" and dtype == torch.bfloat16)
        ):
            self._build_kernel_layout(device)

    def _clear_caches(self) -> None:
        self._scales_and_zeros.clear()

    def extra_repr(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        return super().extra_repr() + f", int4, group_size={self.group_size}, {kind}"


def _exact_half(t: torch.Tensor) -> torch.Tensor:
    """`t` as float16 when that loses nothing (GGUF's own scales), else float32."""
    half = t.half()
    return half.contiguous() if torch.equal(half.float(), t) else t.float().contiguous()


def to_gguf_order(w: Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An int4 weight in Frota's CPU kernel layout: (qs, d, m) with w = q * d + m.

    qs is uint8 `[out, in // 2]`, each run of 32 elements in 16 bytes, element i in
    the low nibble of byte i and element i + 16 in its high nibble (GGUF's order);
    d and m are `[out, in // group]`, float16 when both are exact in it.
    """
    q = unpack_int4(w.packed)
    n, k = q.shape
    if k % 32 or w.group_size % 32:
        raise ValueError(f"the int4 kernel layout needs runs of 32 (in={k}, group={w.group_size})")
    q = q.view(n, k // 32, 2, 16)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    d = w.scales.float()
    zeros = w.zeros.float() if w.zeros is not None else torch.zeros_like(d)
    m = zeros - 8.0 * d
    d16, m16 = _exact_half(d), _exact_half(m)
    if d16.dtype != m16.dtype:
        d16, m16 = d.contiguous(), m.contiguous()
    return qs, d16, m16


def dequantize_gguf_order(
    qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, group_size: int
) -> torch.Tensor:
    """float32 `[out, in]` of Frota's int4 kernel layout (see `to_gguf_order`), in torch."""
    n = qs.shape[0]
    runs = qs.view(n, -1, 16)
    q = torch.stack([runs & 0x0F, runs >> 4], dim=2).reshape(n, -1).float()
    g = q.view(n, -1, group_size) * d.float()[:, :, None] + m.float()[:, :, None]
    return g.reshape(n, -1)


class Fp8Linear(QuantLinear):
    """float8 e4m3 weight linear: `_scaled_mm` where the GPU has fp8, dequantize elsewhere."""

    def __init__(self, weight: Fp8Weight, bias: torch.Tensor | None = None) -> None:
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias)
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("scales", weight.scales.float())

    def kernel_name(self, x: torch.Tensor) -> str:
        return "scaled_mm" if fp8_supported(x.device) else "dequant"

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8(Fp8Weight(self.qweight, self.scales), dtype)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_name(x) == "scaled_mm":
            return fp8_scaled_mm(x, self.qweight, self.scales)
        return F.linear(x, self.dequantized_weight(x.dtype))


def fp8_scaled_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x @ (qweight * scales)^T with `torch._scaled_mm`: x is cast to fp8 with a per-tensor scale.

    The weight's per-channel scales are applied to the output, which keeps the
    call within what every `_scaled_mm` build accepts (per-tensor scales).
    """
    out_dtype = x.dtype if x.dtype in FUSED_DTYPES else torch.bfloat16
    rows = x.shape[0]
    pad = (-rows) % 16  # CUDA's fp8 GEMM wants dimensions in multiples of 16
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    x_scale = (x.abs().amax().float() / FP8_E4M3_MAX).clamp(min=1e-12)
    x8 = (x.float() / x_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    per_tensor = scales.dim() == 0
    w_scale = scales.float() if per_tensor else one
    y = torch._scaled_mm(x8, qweight.t(), x_scale, w_scale, out_dtype=out_dtype)[:rows]
    if not per_tensor:
        y = y * scales.to(y.dtype)
    return y.to(x.dtype)


_LAYERS: dict[type, Callable[..., QuantLinear]] = {
    Int8Weight: Int8Linear, Int4Weight: Int4Linear, Fp8Weight: Fp8Linear}


def make_quant_linear(weight: QuantizedWeight, bias: torch.Tensor | None = None) -> QuantLinear:
    """Wrap an already quantized weight in the matching layer."""
    return _LAYERS[type(weight)](weight, bias)


def quantize_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    method: str,
    group_size: int = 32,
    symmetric: bool = False,
) -> QuantLinear:
    """Quantize a float weight `[out, in]` with `method` (int8 | int4 | fp8) into a layer."""
    return make_quant_linear(quantize(weight, method, group_size, symmetric), bias)
