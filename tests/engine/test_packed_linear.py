"""oneDNN-packed linears compute what F.linear computes, and packing touches only plain
nn.Linear modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frota.engine.kernels import linear as packing

pytestmark = pytest.mark.skipif(not packing.supported(torch.float32),
                                reason="no oneDNN packing: FROTA_PACKED_LINEAR=0, or this torch has no oneDNN")


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_f_linear(rows, dtype, tol, bias):
    if not packing.supported(dtype):  # the engine then keeps F.linear for that dtype
        pytest.skip(f"oneDNN cannot pack {dtype} weights on this CPU (bfloat16 needs avx512bw, "
                    "avx512vl and avx512dq, or avx_ne_convert)")
    torch.manual_seed(rows)
    layer = nn.Linear(96, 200, bias=bias).to(dtype)
    x = torch.randn(rows, 96, dtype=dtype)
    with torch.inference_mode():
        got = packing.PackedLinear(layer)(x)
        want = F.linear(x, layer.weight, layer.bias)
    assert got.dtype == dtype and got.shape == (rows, 200)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_weight_reads_back_exactly():
    layer = nn.Linear(32, 16)
    assert torch.equal(packing.PackedLinear(layer).weight, layer.weight.detach())


class _Sub(nn.Linear):
    pass


def test_pack_linears_replaces_only_plain_linears():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 4), nn.ReLU()), _Sub(4, 4),
                          nn.Linear(4, 4).to(torch.float16))
    x = torch.randn(3, 8)
    with torch.inference_mode():
        before = model[:3](x)
        assert packing.pack_linears(model) == 2
        after = model[:3](x)
    assert isinstance(model[0], packing.PackedLinear) and isinstance(model[1][0], packing.PackedLinear)
    assert type(model[2]) is _Sub and type(model[3]) is nn.Linear  # subclass, float16: untouched
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert packing.pack_linears(model) == 0  # idempotent


def test_a_dtype_onednn_cannot_pack_here_is_left_to_f_linear():
    model = nn.Sequential(nn.Linear(64, 64).to(torch.bfloat16))
    packed = packing.pack_linears(model)
    assert packed == int(packing.supported(torch.bfloat16))
    assert isinstance(model[0], packing.PackedLinear | packing.AmxLinear) == bool(packed)


def test_packing_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FROTA_PACKED_LINEAR", "0")
    packing.supported.cache_clear()
    try:
        assert packing.pack_linears(nn.Sequential(nn.Linear(4, 4))) == 0
    finally:
        monkeypatch.delenv("FROTA_PACKED_LINEAR")
        packing.supported.cache_clear()
