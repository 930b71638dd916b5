"""The header of a .safetensors file, read and checked before a byte of it is mapped.

The format: an 8-byte little-endian length N, N bytes of JSON (tensor name -> dtype,
shape and [begin, end) byte offsets into the data that follows), then the data. The
loader views each tensor as bytes [begin, end) of one mapping of the file, so a header
that lies would have it read outside the file, read one tensor's bytes as another's, or
view more elements than the bytes hold. A file is refused, naming the tensor, when:

- the length or the JSON is not one (too short, past the end, over MAX_HEADER_BYTES,
  not an object, a name given twice);
- an entry is not a known dtype, a shape of non-negative integers and two offsets;
- its offsets point outside the file;
- its byte count disagrees with its dtype and shape;
- two tensors' bytes overlap, or bytes lie between them or after the last (the format
  packs the tensors end to end; the reference implementation refuses the same).

Pure Python (no torch): `safetensors.mapped_tensors` maps what this returns.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from frota.engine.errors import UnsupportedModelError

# The reference implementation's limit: a header is names and numbers, never this large.
MAX_HEADER_BYTES = 100 << 20
# safetensors' dtype names the loader maps -> bytes per element
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the header: its bytes are data[begin:end]."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A checked header: where the data starts in the file, and its tensors in file order."""

    data_start: int
    tensors: tuple[TensorEntry, ...]


def read_header(file: Path, f: BinaryIO, size: int) -> Header:
    """The checked header of the open file `f` of `size` bytes; UnsupportedModelError
    naming `file` and what is wrong."""
    head = f.read(8)
    if len(head) < 8:
        raise UnsupportedModelError(f"{file}: not a safetensors file (shorter than its header)")
    header_len = int.from_bytes(head, "little")
    if header_len > size - 8:
        raise UnsupportedModelError(f"{file}: not a safetensors file (header past the end)")
    if header_len > MAX_HEADER_BYTES:
        raise UnsupportedModelError(f"{file}: a header of {header_len} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(f.read(header_len), object_pairs_hook=_no_repeats)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise UnsupportedModelError(f"{file}: the header is not JSON: {_first_line(exc)}") from None
    if not isinstance(header, dict):
        raise UnsupportedModelError(f"{file}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise UnsupportedModelError(f"{file}: __metadata__ is not an object of strings")
    data_len = size - 8 - header_len
    tensors = sorted((_entry(file, name, value, data_len) for name, value in header.items()),
                     key=lambda t: (t.begin, t.end))
    _check_packed(file, tensors, data_len)
    return Header(8 + header_len, tuple(tensors))


def _entry(file: Path, name: str, value: Any, data_len: int) -> TensorEntry:
    where = f"{file}: tensor {name!r}"
    if not isinstance(value, dict):
        raise UnsupportedModelError(f"{where}: its entry is not an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise UnsupportedModelError(f"{where} has dtype {dtype}, not one of {', '.join(DTYPE_BYTES)}")
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise UnsupportedModelError(f"{where}: its shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise UnsupportedModelError(f"{where}: its data_offsets {offsets!r} are not [begin, end] "
                                    "with 0 <= begin <= end")
    begin, end = offsets
    if end > data_len:
        raise UnsupportedModelError(f"{where}: its data_offsets [{begin}, {end}] point outside the "
                                    f"file (its data holds {data_len} bytes)")
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != expected:
        raise UnsupportedModelError(f"{where}: its data_offsets hold {end - begin} bytes, but dtype "
                                    f"{dtype} and shape {shape} need {expected}")
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _check_packed(file: Path, tensors: list[TensorEntry], data_len: int) -> None:
    """The tensors' byte ranges in order: each starts where the last ended, from 0 to the end."""
    position, last = 0, ""
    for t in tensors:
        if t.begin < position:
            raise UnsupportedModelError(f"{file}: tensor {t.name!r} at [{t.begin}, {t.end}] overlaps "
                                        f"{last}, which ends at {position}")
        if t.begin > position:
            raise UnsupportedModelError(f"{file}: bytes [{position}, {t.begin}) before tensor {t.name!r} "
                                        "belong to no tensor")
        position, last = t.end, f"tensor {t.name!r}"
    if position != data_len:
        raise UnsupportedModelError(f"{file}: bytes [{position}, {data_len}) after the last tensor "
                                    "belong to no tensor")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is given twice")
        out[key] = value
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
