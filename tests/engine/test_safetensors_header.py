"""The mmap loader checks a .safetensors header before it maps a byte: offsets outside the
file, overlapping tensors, and byte counts that disagree with the dtype and shape are
refused by name, each from a crafted file. Bad input is an UnsupportedModelError (the
worker fails its start saying why), never another exception or a view past the file."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest
import torch

from frota.engine.errors import UnsupportedModelError
from frota.engine.loader.safetensors import mapped_tensors
from frota.engine.loader.safetensors_header import DTYPE_BYTES, MAX_HEADER_BYTES


def craft(path: Path, header: dict | bytes, data: bytes, header_len: int | None = None) -> Path:
    """A .safetensors file with exactly this header (JSON, or raw bytes) and data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def f32(shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def refused(path: Path) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        list(mapped_tensors(path))
    assert str(path) in str(info.value)  # the file is named
    return str(info.value)


def test_a_file_the_safetensors_library_writes_is_read_whole_in_file_order(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(6, dtype=torch.float32).view(2, 3), "a": torch.tensor(2.5),
               "empty": torch.zeros(0, 4), "mask": torch.tensor([True, False])}
    save_file(tensors, tmp_path / "ok.safetensors", metadata={"format": "pt"})
    mapped = dict(mapped_tensors(tmp_path / "ok.safetensors"))
    assert mapped.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert torch.equal(mapped[name], tensor), name


@pytest.mark.parametrize("end", [20, 2**63], ids=["past-the-end", "huge"])
def test_offsets_that_point_outside_the_file_are_refused(tmp_path: Path, end: int) -> None:
    path = craft(tmp_path / "out.safetensors", {"w": f32([4], end - 16, end)}, bytes(16))
    assert "'w'" in refused(path) and "outside the file" in refused(path)


def test_overlapping_tensors_are_refused_naming_both(tmp_path: Path) -> None:
    # Both fit the file and match their shapes: only the overlap is wrong.
    path = craft(tmp_path / "overlap.safetensors",
                 {"a": f32([4], 0, 16), "b": f32([4], 8, 24), "c": f32([2], 16, 24)}, bytes(24))
    message = refused(path)
    assert "overlaps" in message and "'a'" in message and "'b'" in message


@pytest.mark.parametrize(("entry", "data"), [
    (f32([2, 3], 0, 16), 16),  # 6 float32 need 24 bytes
    ({"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}, 16),  # 4 bf16 are 8 bytes
    (f32([], 0, 8), 8),  # a scalar is one element
    (f32([0, 1 << 62], 0, 8), 8),  # no elements, yet bytes
], ids=["shape", "dtype", "scalar", "empty"])
def test_offsets_that_disagree_with_the_dtype_and_shape_are_refused(tmp_path: Path, entry: dict, data: int) -> None:
    path = craft(tmp_path / "shape.safetensors", {"w": entry}, bytes(data))
    assert "'w'" in refused(path) and "need" in refused(path)


@pytest.mark.parametrize(("header", "data", "says"), [
    ({"a": f32([1], 0, 4), "b": f32([1], 8, 12)}, 12, "belong to no tensor"),  # a hole
    ({"a": f32([1], 4, 8)}, 8, "belong to no tensor"),  # bytes before the first
    ({"a": f32([1], 0, 4)}, 8, "after the last tensor"),  # bytes after the last
], ids=["gap", "leading", "trailing"])
def test_bytes_that_belong_to_no_tensor_are_refused_as_the_reference_loader_does(
        tmp_path: Path, header: dict, data: int, says: str) -> None:
    assert says in refused(craft(tmp_path / "gap.safetensors", header, bytes(data)))


@pytest.mark.parametrize(("header", "says"), [
    (b"[1, 2]", "not a JSON object"),
    (b'{"w": ', "not JSON"),
    (b'{"w": "\xff"}', "not JSON"),  # not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nesting deep enough to exhaust the stack
    (json.dumps({"w": f32([1], 0, 4)})[:-1].encode() + b', "w": ' + json.dumps(f32([1], 0, 4)).encode() + b"}",
     "given twice"),
    (json.dumps({"w": "F32"}).encode(), "not an object"),
    (json.dumps({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode(), "dtype F8_E4M3"),
    (json.dumps({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}).encode(), "shape"),
    (json.dumps({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}).encode(), "shape"),
    (json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}).encode(), "data_offsets"),
    (json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}).encode(), "data_offsets"),
    (json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}).encode(), "data_offsets"),
    (json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}).encode(), "data_offsets"),
    (json.dumps({"__metadata__": {"format": 1}, "w": f32([1], 0, 4)}).encode(), "__metadata__"),
], ids=["array", "truncated", "utf8", "deep", "twice", "entry", "dtype", "negative", "bool", "reversed",
        "three", "negative-offset", "float-offset", "metadata"])
def test_a_header_that_is_not_one_is_refused(tmp_path: Path, header: bytes, says: str) -> None:
    assert says in refused(craft(tmp_path / "bad.safetensors", header, bytes(4)))


def test_a_header_length_past_the_end_or_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    assert "past the end" in refused(craft(tmp_path / "long.safetensors", b"{}", b"", header_len=1 << 40))
    big = tmp_path / "big.safetensors"
    with big.open("wb") as f:  # sparse: a file larger than the limit costs no disk
        f.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        f.truncate(MAX_HEADER_BYTES + 64)
    assert "at most" in refused(big)


def test_random_headers_are_loaded_within_the_file_or_refused_never_anything_else(tmp_path: Path) -> None:
    """Seeded random headers near the valid ones: each either maps tensors that cover the
    data exactly, or is an UnsupportedModelError; no IndexError, RuntimeError or view
    past the file."""
    rng = random.Random(47)
    dtypes = ["F32", "F16", "BF16", "I8", "U8", "BOOL", "I64", "F8_E5M2", "X"]
    loaded = refused_count = 0
    for case in range(400):
        data_len = rng.randrange(0, 48)
        header: dict = {}
        position = 0
        for i in range(rng.randrange(0, 4)):
            dtype = rng.choice(dtypes)
            shape = [rng.randrange(0, 4) for _ in range(rng.randrange(0, 3))]
            size = math.prod(shape) * DTYPE_BYTES.get(dtype, 1)
            begin = position + rng.choice([0, 0, 0, -2, 1])
            end = begin + size + rng.choice([0, 0, 0, 1, -1])
            header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
            position = max(position, end)
        path = craft(tmp_path / f"r{case}.safetensors", header, bytes(range(data_len)))
        try:
            tensors = [t.clone() for _, t in mapped_tensors(path)]
        except UnsupportedModelError:
            refused_count += 1
            continue
        loaded += 1
        assert sum(t.numel() * t.element_size() for t in tensors) == data_len
    assert loaded and refused_count  # both outcomes were exercised
