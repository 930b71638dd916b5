"""Quantized linears: each kernel matches the float reference built from the same
quantized weight (the kernel is right; quantization error is tested in test_formats)."""

from __future__ import annotations

import pytest
import torch

from frota.engine.kernels import build, extensions, prebuilt
from frota.engine.quant import cpu_kernels, linear
from frota.engine.quant.formats import quantize_fp8, quantize_int4, quantize_int8
from frota.engine.quant.gguf_native import q4_1_to_int4
from frota.engine.quant.linear import (
    GEMV_MAX_ROWS,
    Fp8Linear,
    Int4Linear,
    Int8Linear,
    dequantize_gguf_order,
    fp8_scaled_mm,
    fp8_supported,
    to_gguf_order,
)

HAVE_FROTA = cpu_kernels.kernels() is not None


def require_frota() -> None:
    if not HAVE_FROTA:
        pytest.skip("Frota's C++ CPU kernels could not be built here (no compiler?)")


@pytest.fixture(params=["frota", "torch"])
def kernels(request, monkeypatch):  # type: ignore[no-untyped-def]
    """Each layer test runs with Frota's compiled CPU kernels and with the torch fallback."""
    if request.param == "frota":
        require_frota()
    if request.param == "torch":
        monkeypatch.setattr(linear, "frota_kernels", lambda device: None)
    return request.param

# max error relative to the output's largest value: float32 accumulation, or bf16's
# 8-bit rounding of activations, scales and outputs
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
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


def _expected_int8(kernels: str, x: torch.Tensor, grouped: bool) -> str:
    if kernels == "frota":
        return "frota_int8" if x.shape[0] <= GEMV_MAX_ROWS else "dequant"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return "dequant"
    if not grouped:
        return "int8pack_mm"
    return "int8pack_mm_grouped" if x.shape[0] <= Int8Linear.GROUPED_MAX_ROWS else "dequant"


ROWS = [1, 3, 5, 8, 33]
PER_CHANNEL_SHAPES = [*SHAPES, (7, 48)]  # 7 rows, 48 columns: the kernels' tails


def _per_channel_layer(shape: tuple[int, int], dtype: torch.dtype) -> Int8Linear:
    torch.manual_seed(0)
    layer = Int8Linear(quantize_int8(torch.randn(*shape)), bias=torch.randn(shape[0]))
    layer.prepare(dtype)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", PER_CHANNEL_SHAPES)
def test_int8_per_channel_matches_dequantized_reference(kernels, dtype, rows, shape) -> None:  # type: ignore[no-untyped-def]
    layer = _per_channel_layer(shape, dtype)
    x = _inputs(rows, shape[1], dtype)
    assert layer.kernel_name(x) == _expected_int8(kernels, x, grouped=False)
    _check(layer, x)


@pytest.mark.parametrize("rows", [r for r in ROWS if r <= GEMV_MAX_ROWS])
@pytest.mark.parametrize("shape", PER_CHANNEL_SHAPES)
def test_int8_per_channel_float16_activations_take_frotas_kernel(rows, shape) -> None:  # type: ignore[no-untyped-def]
    """float16 activations are checked on Frota's kernel alone (at decode sizes): elsewhere
    they are dequantized, as every dtype is."""
    require_frota()
    layer = _per_channel_layer(shape, torch.float16)
    x = _inputs(rows, shape[1], torch.float16)
    assert layer.kernel_name(x) == "frota_int8"
    _check(layer, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 5, 33])
@pytest.mark.parametrize("shape", [(96, 256), (6, 64)])
def test_int8_group_wise_matches_dequantized_reference(kernels, dtype, rows, shape) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Int8Linear(quantize_int8(torch.randn(*shape), group_size=32))
    layer.prepare(dtype)
    x = _inputs(rows, shape[1], dtype)
    assert layer.kernel_name(x) == _expected_int8(kernels, x, grouped=True)
    _check(layer, x)


def test_int8_group_wise_head_is_one_kernel_call() -> None:
    """A GGUF Q8_0 LM head (int8, group 32) at decode is one call of Frota's kernel (the torch
    fallback runs one call per group)."""
    require_frota()
    layer = Int8Linear(quantize_int8(torch.randn(256, 576), group_size=32))
    layer.prepare(torch.bfloat16)
    assert layer.grouped_qweight is None and layer.qweight is not None  # one copy, row-major
    with torch.profiler.profile() as prof:
        layer(_inputs(1, 576, torch.bfloat16))
    names = [e.name for e in prof.events()]
    assert not any("int8pack" in n for n in names)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 6, 33])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_matches_dequantized_reference(kernels, dtype, rows, group_size, symmetric) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    rows_out = 194 if kernels == "frota" else 192  # torch's int4 layout needs multiples of 16
    layer = Int4Linear(quantize_int4(torch.randn(rows_out, 256), group_size, symmetric))
    reference = layer.dequantized_weight()
    layer.prepare(dtype)
    x = _inputs(rows, 256, dtype)
    if kernels == "frota":
        expected = "frota_int4" if rows <= GEMV_MAX_ROWS else "dequant"
        assert layer.packed is None and layer.qs is not None and layer.kernel_packed is None
    else:
        expected = "int4pack_mm_cpu" if dtype == torch.bfloat16 else "dequant"
    assert layer.kernel_name(x) == expected
    _check(layer, x)
    # after a kernel layout replaced the packing, the weight still reads back (to fp32 rounding)
    torch.testing.assert_close(layer.dequantized_weight(), reference, rtol=1e-6, atol=1e-6)


def test_int4_kernel_layout_serves_float32_too(kernels) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = Int4Linear(quantize_int4(torch.randn(64, 128), 32))
    layer.prepare(torch.bfloat16)
    x = _inputs(3, 128, torch.float32)
    if kernels == "frota":
        assert layer.packed is None and layer.qs is not None
        assert layer.kernel_name(x) == "frota_int4"
    else:
        assert layer.packed is None and layer.kernel_packed is not None
        assert layer.kernel_name(x) == "int4pack_mm_cpu"
    _check(layer, x)


def _q4_1_bytes(rows: int, cols: int) -> bytes:
    """Random GGUF Q4_1 blocks: float16 d and m, then 16 bytes of nibbles."""
    g = torch.Generator().manual_seed(5)
    blocks = rows * cols // 32
    d = (torch.rand(blocks, generator=g) * 0.01 + 1e-3).half()
    m = (-torch.rand(blocks, generator=g) * 0.08).half()
    qs = torch.randint(0, 256, (blocks, 16), generator=g, dtype=torch.uint8)
    head = torch.stack([d, m], dim=1).view(torch.uint8).reshape(blocks, 4)
    return torch.cat([head, qs], dim=1).numpy().tobytes()


def test_gguf_int4_kernel_layout_is_the_file_and_float16() -> None:
    """A Q4_1 weight goes to the kernel layout with the file's own float16 d and m and
    nibble order, bit for bit."""
    import numpy as np

    raw = np.frombuffer(_q4_1_bytes(8, 64), dtype=np.uint8)
    weight = q4_1_to_int4(raw, 8)
    qs, d, m = to_gguf_order(weight)
    assert d.dtype == torch.float16 and m.dtype == torch.float16
    blocks = torch.from_numpy(raw.copy()).view(-1, 20)
    assert torch.equal(qs.reshape(-1, 16), blocks[:, 4:])
    assert torch.equal(d.reshape(-1), blocks[:, :2].contiguous().view(torch.float16).reshape(-1))
    assert torch.equal(m.reshape(-1), blocks[:, 2:4].contiguous().view(torch.float16).reshape(-1))
    ref = Int4Linear(weight).dequantized_weight()
    torch.testing.assert_close(dequantize_gguf_order(qs, d, m, 32), ref, rtol=1e-6, atol=1e-6)


def test_int4_kernel_layout_falls_back_to_torch_dequant(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A layer already in Frota's layout still runs (dequantize in torch) where the
    extension is not there, e.g. moved to another device."""
    require_frota()
    torch.manual_seed(0)
    layer = Int4Linear(quantize_int4(torch.randn(64, 128), 32))
    layer.prepare(torch.bfloat16)
    x = _inputs(2, 128, torch.bfloat16)
    y = layer(x)
    monkeypatch.setattr(linear, "frota_kernels", lambda device: None)
    assert layer.kernel_name(x) == "dequant"
    _check(layer, x)
    assert (layer(x).float() - y.float()).abs().max() <= TOL[torch.bfloat16] * y.float().abs().max()


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


def test_without_a_compiler_the_layers_use_torch(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """A failed build is logged once and leaves `kernels()` None: torch's ops serve."""
    def no_compiler(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("g++: command not found")

    monkeypatch.setattr(build, "_loaded", {})
    for switch in (build.SWITCH_ENV, build.QUANT_SWITCH_ENV):  # a build is tried, whatever this run's
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setattr(prebuilt, "load", lambda kind: None)  # nor a prebuilt one (FROTA_KERNELS_DIR)
    monkeypatch.setattr(extensions, "compile_extension", no_compiler)
    with caplog.at_level("WARNING", logger="frota.engine.kernels"):
        assert cpu_kernels.kernels() is None
        assert cpu_kernels.kernels() is None
    assert caplog.text.count("unavailable") == 1 and "g++" in caplog.text
    torch.manual_seed(0)
    layer = Int4Linear(quantize_int4(torch.randn(64, 128), 32))
    layer.prepare(torch.bfloat16)
    x = _inputs(1, 128, torch.bfloat16)
    assert layer.qs is None and layer.kernel_name(x) == "int4pack_mm_cpu"
    _check(layer, x)


@pytest.mark.parametrize("switch", [("FROTA_CPU_KERNELS", "0"), ("FROTA_QUANT_KERNELS", "torch")])
def test_kernels_can_be_turned_off(monkeypatch, switch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv(*switch)
    assert cpu_kernels.kernels() is None
    layer = Int8Linear(quantize_int8(torch.randn(32, 64), group_size=32))
    layer.prepare(torch.bfloat16)
    assert layer.kernel_name(_inputs(1, 64, torch.bfloat16)) == "int8pack_mm_grouped"
