"""Weight formats: round trips within each format's error bound, exact int4 packing."""

from __future__ import annotations

import pytest
import torch

from frota.engine.quant.formats import (
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)


@pytest.fixture
def weight() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(96, 256) * torch.logspace(-2, 1, 96).unsqueeze(1)


def test_int4_packing_round_trips_exactly() -> None:
    q = torch.randint(0, 16, (7, 64), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (7, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    # element 2i in the low nibble, 2i+1 in the high nibble
    assert int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)


def test_int8_per_channel_error_within_half_a_scale(weight: torch.Tensor) -> None:
    qw = quantize_int8(weight)
    assert qw.qweight.dtype == torch.int8 and qw.scales.shape == (96,)
    err = (dequantize_int8(qw) - weight).abs()
    assert torch.all(err <= qw.scales[:, None] / 2 + 1e-6)


def test_int8_group_wise_error_within_half_a_group_scale(weight: torch.Tensor) -> None:
    qw = quantize_int8(weight, group_size=32)
    assert qw.scales.shape == (96, 8)
    err = (dequantize_int8(qw) - weight).abs().view(96, 8, 32)
    assert torch.all(err <= qw.scales[:, :, None] / 2 + 1e-6)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_error_within_half_a_group_scale(
    weight: torch.Tensor, group_size: int, symmetric: bool
) -> None:
    qw = quantize_int4(weight, group_size, symmetric)
    assert qw.packed.shape == (96, 128)
    assert (qw.zeros is None) == symmetric
    err = (dequantize_int4(qw) - weight).abs().view(96, 256 // group_size, group_size)
    assert torch.all(err <= qw.scales[:, :, None] / 2 + 1e-5)


def test_int4_rejects_a_group_that_does_not_divide_the_input() -> None:
    with pytest.raises(ValueError, match="group_size"):
        quantize_int4(torch.randn(4, 48), 32)
    with pytest.raises(ValueError, match="one of"):
        quantize_int4(torch.randn(4, 64), 16)


@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_relative_error_within_e4m3_precision(weight: torch.Tensor, per_channel: bool) -> None:
    qw = quantize_fp8(weight, per_channel)
    assert qw.qweight.dtype == torch.float8_e4m3fn
    w = weight if per_channel else weight[-10:]  # per tensor: small rows fall into subnormals
    d = dequantize_fp8(qw) if per_channel else dequantize_fp8(qw)[-10:]
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normal numbers
    big = w.abs() > w.abs().amax(dim=1, keepdim=True) / 32
    assert torch.all(((d - w).abs() / w.abs())[big] <= 2**-4 + 1e-6)
