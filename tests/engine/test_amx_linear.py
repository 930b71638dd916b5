"""bfloat16 linears on AMX tiles (kernels/amx_linear.cpp) compute what oneDNN and F.linear
compute, for every tail of rows and output features, and are chosen only where they apply."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frota.engine import kernels
from frota.engine.kernels import isa
from frota.engine.kernels import linear as packing

ops = packing.amx_ops()


def _why_not() -> str:
    """Why no AMX here: the CPU (its amx_bf16 flag), a switch, or no kernels."""
    if os.environ.get("FROTA_AMX") == "0" or os.environ.get("FROTA_PACKED_LINEAR") == "0":
        return "switched off (FROTA_AMX=0 or FROTA_PACKED_LINEAR=0)"
    if kernels.cpu_kernels() is None:
        return "Frota's C++ kernels cannot be built here"
    if "amx_bf16" not in (isa.host_cpu_flags() or frozenset()):
        return "this CPU has no AMX tiles (amx_bf16)"
    return "this CPU has AMX tiles (amx_bf16) but the OS did not grant them (arch_prctl XCOMP_PERM)"


if ops is None:  # one skip for the module, not one per case: the CPU lacks one feature
    pytest.skip(_why_not(), allow_module_level=True)


def _onednn(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    return packing.PackedLinear(layer)(x)


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 33, 64, 255, 300, 600])  # tile, pass and chunk tails
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 960), (96, 70)])
@pytest.mark.parametrize("bias", [False, True])
def test_amx_equals_onednn_within_a_rounding(rows, in_features, out_features, bias):
    torch.manual_seed(rows * 7 + out_features)
    layer = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = packing.AmxLinear(layer, ops)(x)
        want = _onednn(x, layer)
        exact = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # Both sum exact products in float32 and round once: at most one bfloat16 step apart,
    # and each within half a step of the exact result.
    step = exact.abs().clamp(min=1e-3) * 2**-7
    assert ((got.float() - want.float()).abs() <= step).all()
    assert ((got.float() - exact).abs() <= step + 1e-4).all()


def test_amx_takes_any_leading_shape_and_reads_its_weight_back():
    layer = nn.Linear(64, 48).to(torch.bfloat16)
    amx = packing.AmxLinear(layer, ops)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert amx(x).shape == (2, 3, 48)
        assert torch.equal(amx(x), amx(x.reshape(6, 64)).view(2, 3, 48))
    assert torch.equal(amx.weight, layer.weight.detach())


def test_long_steps_go_to_onednn_except_in_a_layer_that_sees_few_rows():
    torch.manual_seed(0)
    layer = nn.Linear(64, 96).to(torch.bfloat16)
    amx, head = packing.AmxLinear(layer, ops), packing.AmxLinear(layer, ops, few_rows=True)
    assert isinstance(amx.large, packing.PackedLinear) and head.large is None
    long = torch.randn(packing.AmxLinear.MAX_ROWS + 1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(amx(long), _onednn(long, layer))
        short = long[: packing.AmxLinear.MAX_ROWS]
        assert torch.equal(amx(short), ops.amx_linear(short, amx.packed, 96, amx.bias))
        torch.testing.assert_close(head(long).float(), amx(long).float(), atol=0.05, rtol=0.01)


def test_amx_rejects_what_it_cannot_run():
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.amx_pack_weight(torch.randn(16, 40, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.amx_pack_weight(torch.randn(16, 64))
    packed = ops.amx_pack_weight(torch.randn(16, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="features"):
        ops.amx_linear(torch.randn(2, 32, dtype=torch.bfloat16), packed, 16)
    with pytest.raises(RuntimeError, match="out_features"):
        ops.amx_linear(torch.randn(2, 64, dtype=torch.bfloat16), packed, 40)


def test_pack_linears_puts_bfloat16_layers_on_amx_and_the_rest_on_onednn(monkeypatch):
    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16), nn.Linear(40, 8).to(torch.bfloat16),
                             nn.Linear(64, 32))

    m = model()
    assert packing.pack_linears(m, few_rows=("0",)) == 3
    assert [type(layer) for layer in m] == [packing.AmxLinear, packing.PackedLinear, packing.PackedLinear]
    assert m[0].large is None  # named as a layer of few rows
    monkeypatch.setenv("FROTA_AMX", "0")
    m = model()
    packing.pack_linears(m)
    assert all(type(layer) is packing.PackedLinear for layer in m)
