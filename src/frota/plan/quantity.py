"""Kubernetes resource quantities as numbers."""

from __future__ import annotations

import re

_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")


def parse_quantity(text: str | int) -> float:
    """'2Gi' -> 2147483648.0, '500m' -> 0.5."""
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def format_bytes(num: float) -> str:
    """1288490188 -> '1.20 GiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num >= size:
            return f"{num / size:.2f} {unit}"
    return f"{int(num)} B"
