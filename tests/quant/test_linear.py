"""Quantized linears: each kernel matches the float reference built from the same
quantized weight (the kernel is right; quantization error is tested in test_formats)."""

from __future__ import annotations

import pytest
import torch
from frota.engine.quant.formats import quantize_fp8, quantize_int4, quantize_int8
from frota.engine.quant.linear import (
    Fp8Linear,
    Int4Linear,
    Int8Linear,
    fp8_scaled_mm,
    fp8_supported,
)

# max error relative to the output's largest value: float32 accumulation, or bf16's
# 8-bit rounding of activations, scales and outputs
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SHAPES = [(192, 576), (64, 128)]


def _inputs(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(rows, k).to(dtype)


def _check(layer, x: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    ref = x.float() @ layer.dequantized_weight(torch.float32).t()
    if layer.bias is not None:
        ref = ref + layer.bias.float()
    y = layer(x)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert (y.float() - ref).abs().max() <= TOL[x.dtype] * ref.abs().max(), layer.kernel_name(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_per_channel_matches_dequantized_reference(dtype, rows, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Int8Linear(quantize_int8(torch.randn(*shape)), bias=torch.randn(shape[0]))
    x = _inputs(rows, shape[1], dtype)
    expected = "int8pack_mm" if dtype == torch.bfloat16 else "dequant"
    assert layer.kernel_name(x) == expected
    _check(layer, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_int8_group_wise_matches_dequantized_reference(dtype, rows) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Int8Linear(quantize_int8(torch.randn(96, 256), group_size=32))
    layer.prepare(dtype)
    _check(layer, _inputs(rows, 256, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_matches_dequantized_reference(dtype, rows, group_size, symmetric) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Int4Linear(quantize_int4(torch.randn(192, 256), group_size, symmetric))
    reference = layer.dequantized_weight()
    layer.prepare(dtype)
    x = _inputs(rows, 256, dtype)
    expected = "int4pack_mm_cpu" if dtype == torch.bfloat16 else "dequant"
    assert layer.kernel_name(x) == expected
    _check(layer, x)
    # after the kernel layout replaced the packing, the weight still reads back (to fp32 rounding)
    torch.testing.assert_close(layer.dequantized_weight(), reference, rtol=1e-6, atol=1e-6)


def test_int4_kernel_layout_serves_float32_too() -> None:
    torch.manual_seed(0)
    layer = Int4Linear(quantize_int4(torch.randn(64, 128), 32))
    layer.prepare(torch.bfloat16)
    assert layer.packed is None and layer.kernel_packed is not None
    x = _inputs(3, 128, torch.float32)
    assert layer.kernel_name(x) == "int4pack_mm_cpu"
    _check(layer, x)


def test_model_to_dtype_keeps_quantized_storage_and_scales() -> None:
    layer = torch.nn.Sequential(
        Int8Linear(quantize_int8(torch.randn(32, 64))), Fp8Linear(quantize_fp8(torch.randn(16, 32)))
    )
    layer.to(torch.bfloat16)
    assert layer[0].scales.dtype == torch.float32
    assert layer[1].qweight.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_fallback_matches_dequantized_reference(dtype) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Fp8Linear(quantize_fp8(torch.randn(64, 128)))
    x = _inputs(4, 128, dtype)
    assert layer.kernel_name(x) == "dequant"  # no fp8 GPU here
    _check(layer, x)


@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_scaled_mm_call_matches_reference_on_cpu(per_channel: bool) -> None:
    """The `_scaled_mm` call (scales, transposes, padding) checked through torch's CPU
    implementation; only the activation's fp8 rounding separates it from the reference."""
    torch.manual_seed(0)
    qw = quantize_fp8(torch.randn(64, 128), per_channel)
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    y = fp8_scaled_mm(x, qw.qweight, qw.scales)
    layer = Fp8Linear(qw)
    ref = x.float() @ layer.dequantized_weight().t()
    assert y.shape == (5, 64)
    assert (y.float() - ref).abs().max() <= 0.08 * ref.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_cuda_kernels_match_reference() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(3, 256, dtype=torch.bfloat16, device=dev)
    layers = [
        Int8Linear(quantize_int8(torch.randn(128, 256))).to(dev),
        Int4Linear(quantize_int4(torch.randn(128, 256), 32)).to(dev),
    ]
    if fp8_supported(dev):
        layers.append(Fp8Linear(quantize_fp8(torch.randn(128, 256))).to(dev))
    for layer in layers:
        ref = x.float() @ layer.dequantized_weight().t()
        assert (layer(x).float() - ref).abs().max() <= 3e-2 * ref.abs().max()


@pytest.mark.skipif(
    not (torch.cuda.is_available() and fp8_supported(torch.device("cuda"))),
    reason="fp8 _scaled_mm needs a GPU with compute capability >= 8.9 (none on this machine)",
)
def test_fp8_uses_scaled_mm_on_capable_gpus() -> None:
    layer = Fp8Linear(quantize_fp8(torch.randn(128, 256))).to("cuda")
    x = torch.randn(3, 256, dtype=torch.bfloat16, device="cuda")
    assert layer.kernel_name(x) == "scaled_mm"
