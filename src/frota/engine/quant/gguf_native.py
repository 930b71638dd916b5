"""GGUF's own quantized blocks mapped onto Frota's formats with no re-rounding.

- Q4_0 block (18 bytes): f16 d, 16 bytes of 32 nibbles; w = (q - 8) * d
  -> `Int4Weight`, group 32, scale d, zero 0.
- Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of 32 nibbles; w = q * d + m
  -> `Int4Weight`, group 32, scale d, zero m + 8 d (the same line, in the
  kernels' (q - 8) * scale + zero form).
- Q8_0 block (34 bytes): f16 d, 32 int8; w = q * d
  -> `Int8Weight`, group 32.

Inside a 4-bit block the low nibbles of the 16 bytes are elements 0..15 and
the high nibbles elements 16..31; `pack_int4` pairs neighbours instead, so
the nibbles are reordered (a permutation: nothing is rounded).
"""

from __future__ import annotations

import numpy as np
import torch

from frota.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, pack_int4

GGUF_BLOCK = 32
NATIVE_TYPES = ("Q4_0", "Q4_1", "Q8_0")
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def _blocks(raw: np.ndarray, type_name: str, rows: int) -> np.ndarray:
    """The raw uint8 data of a tensor as `[rows, blocks_per_row, block_bytes]`."""
    block_bytes = _BLOCK_BYTES[type_name]
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1)
    if data.shape[1] % block_bytes:
        raise ValueError(f"{type_name} row of {data.shape[1]} bytes is not whole blocks")
    return data.reshape(rows, data.shape[1] // block_bytes, block_bytes)


def _f16(blocks: np.ndarray, offset: int) -> torch.Tensor:
    half = np.ascontiguousarray(blocks[:, :, offset : offset + 2]).view(np.float16)[..., 0]
    return torch.from_numpy(half.astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """16 bytes per block -> 32 values per block in element order, `[rows, blocks * 32]`."""
    low = qs & 0x0F
    high = qs >> 4
    values = np.concatenate([low, high], axis=-1)  # elements 0..15, then 16..31
    return torch.from_numpy(values.reshape(qs.shape[0], -1))


def q4_0_to_int4(raw: np.ndarray, rows: int) -> Int4Weight:
    """A Q4_0 tensor's bytes `[rows, ...]` as an exact symmetric int4 group-32 weight."""
    blocks = _blocks(raw, "Q4_0", rows)
    d = _f16(blocks, 0)
    q = _nibbles(blocks[:, :, 2:])
    return Int4Weight(pack_int4(q), d, None, GGUF_BLOCK)


def q4_1_to_int4(raw: np.ndarray, rows: int) -> Int4Weight:
    """A Q4_1 tensor's bytes `[rows, ...]` as an exact asymmetric int4 group-32 weight."""
    blocks = _blocks(raw, "Q4_1", rows)
    d = _f16(blocks, 0)
    m = _f16(blocks, 2)
    q = _nibbles(blocks[:, :, 4:])
    return Int4Weight(pack_int4(q), d, m + 8.0 * d, GGUF_BLOCK)


def q8_0_to_int8(raw: np.ndarray, rows: int) -> Int8Weight:
    """A Q8_0 tensor's bytes `[rows, ...]` as an exact int8 group-32 weight."""
    blocks = _blocks(raw, "Q8_0", rows)
    d = _f16(blocks, 0)
    q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, -1)
    return Int8Weight(torch.from_numpy(q.copy()), d, GGUF_BLOCK)


def native_weight(raw: np.ndarray, type_name: str, rows: int) -> QuantizedWeight | None:
    """The exact Frota format of a GGUF tensor, or None when its type has no native mapping."""
    if type_name == "Q4_0":
        return q4_0_to_int4(raw, rows)
    if type_name == "Q4_1":
        return q4_1_to_int4(raw, rows)
    if type_name == "Q8_0":
        return q8_0_to_int8(raw, rows)
    return None


def permute_rows(weight: QuantizedWeight, index: torch.Tensor) -> QuantizedWeight:
    """Reorder the output rows of a quantized weight (e.g. undoing llama.cpp's q/k permutation)."""
    if isinstance(weight, Int4Weight):
        zeros = None if weight.zeros is None else weight.zeros[index]
        return Int4Weight(weight.packed[index], weight.scales[index], zeros, weight.group_size)
    if isinstance(weight, Int8Weight):
        return Int8Weight(weight.qweight[index], weight.scales[index], weight.group_size)
    raise TypeError(f"cannot permute rows of {type(weight).__name__}")


def concat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """Stack quantized weights along their output rows (fused q/k/v, gate/up), or None
    when they do not share one format (then the caller quantizes the fused float weight)."""
    first = weights[0]
    if isinstance(first, Int4Weight):
        same = all(
            isinstance(w, Int4Weight)
            and w.group_size == first.group_size
            and (w.zeros is None) == (first.zeros is None)
            for w in weights
        )
        if not same:
            return None
        parts = [w for w in weights if isinstance(w, Int4Weight)]
        zeros = None if first.zeros is None else torch.cat([w.zeros for w in parts])  # type: ignore[misc]
        return Int4Weight(
            torch.cat([w.packed for w in parts]),
            torch.cat([w.scales for w in parts]),
            zeros,
            first.group_size,
        )
    if isinstance(first, Int8Weight):
        parts8 = [w for w in weights if isinstance(w, Int8Weight) and w.group_size == first.group_size]
        if len(parts8) != len(weights):
            return None
        return Int8Weight(
            torch.cat([w.qweight for w in parts8]),
            torch.cat([w.scales for w in parts8]),
            first.group_size,
        )
    return None
