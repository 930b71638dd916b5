"""Which rows of a step run under which slot.

Rows of sequences without an adapter are simply not listed: "no adapter" is the absence of
a row, never a sentinel index (vLLM's CPU ops read -1 as the last slot, and so served the
base model's requests with whatever adapter sat there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class LoRABatch:
    """Decode rows by gather (one index per row), prefill chunks by segment."""

    decode_rows: torch.Tensor | None  # [n] long: input rows of decoding sequences with an adapter
    decode_slots: torch.Tensor | None  # [n] long: the slot of each
    segments: list[tuple[int, int, int]]  # (first row, end row, slot) of each prefill chunk


def build_batch(rows: Iterable[tuple[int, int, int | None]], device: torch.device) -> LoRABatch | None:
    """From (first row, number of rows, slot or None) per sequence of the step, in row order;
    None when no row runs under an adapter (the step is the base model's alone)."""
    decode_rows: list[int] = []
    decode_slots: list[int] = []
    segments: list[tuple[int, int, int]] = []
    for row, n, slot in rows:
        if slot is None:
            continue
        if n == 1:
            decode_rows.append(row)
            decode_slots.append(slot)
        else:
            segments.append((row, row + n, slot))
    if not decode_rows and not segments:
        return None
    if not decode_rows:
        return LoRABatch(None, None, segments)
    return LoRABatch(torch.tensor(decode_rows, dtype=torch.long, device=device),
                     torch.tensor(decode_slots, dtype=torch.long, device=device), segments)
