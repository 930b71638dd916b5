"""Linear layers with their weights packed once for the CPU's matmul kernels.

`F.linear` on the CPU hands the weight to the BLAS in its stored layout every
call, so a small-batch matmul (a decode step) spends its time re-reading the
weight in an unfriendly order. oneDNN can reorder a weight once into the
blocked layout its kernels stream best; with it, on the 2-core development
machine, a batch-16 fp32 decode step's matmuls take about half the time and
the 49,152-row LM head a third (see `bench/engine_throughput.py`).

`pack_linears(model)` swaps every plain `nn.Linear` of a CPU model for one of:

- `AmxLinear`, bfloat16 weights on a CPU with AMX tiles (Intel Sapphire Rapids
  and later): Frota's own kernel (`amx_linear.cpp`) for steps of up to 256
  rows, which streams a decode step's weights at the memory's speed where
  oneDNN reached about two thirds of it, and oneDNN, from a second copy of the
  weight, for longer prefill chunks, where its blocking is the faster one (the
  LM head, which only sees sampling rows, keeps one copy);
- `PackedLinear` otherwise: the weight reordered once for oneDNN.

A tied LM head keeps its embedding: the packed copy is extra memory (the head's
size once more), which is why `FROTA_PACKED_LINEAR=0` turns packing off;
`FROTA_AMX=0` keeps oneDNN on AMX CPUs. Packing is skipped, and `nn.Linear`
kept, where this torch lacks the oneDNN ops or they disagree with `F.linear` on
a probe.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Collection
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from frota.engine import kernels

log = logging.getLogger(__name__)

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


class PackedLinear(nn.Module):
    """An inference-only `nn.Linear` whose weight is kept in oneDNN's layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.dtype = weight.dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    @property
    def weight(self) -> torch.Tensor:
        """The weight in its usual `[out, in]` layout: a copy, for inspection (the packed
        tensor is the only one kept)."""
        return self.packed.to_dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for oneDNN"


class AmxLinear(nn.Module):
    """An inference-only bfloat16 `nn.Linear` run on AMX tiles, its weight in the tiles' layout
    (`amx_linear.cpp`).

    Frota's kernel is the faster one for steps of up to `MAX_ROWS` rows (decode steps, short
    prompts); for more (long prefill chunks) oneDNN's is, so a layer that sees those keeps a
    second copy of its weight packed for oneDNN (`large`) and hands them over. A layer that
    only sees a step's sampling rows (the LM head) keeps none."""

    MAX_ROWS = 256  # steps of more rows go to `large`, where there is one

    def __init__(self, linear: nn.Linear, ops, few_rows: bool = False) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.dtype = linear.weight.dtype
        self._ops = ops
        self.packed = ops.amx_pack_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.large = None if few_rows else PackedLinear(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.large is not None and rows.shape[0] > self.MAX_ROWS:
            return self.large(x)
        out = self._ops.amx_linear(rows, self.packed, self.out_features, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The weight in its usual `[out, in]` layout: a copy, for inspection."""
        eye = torch.eye(self.in_features, dtype=self.dtype)
        return self._ops.amx_linear(eye, self.packed, self.out_features, None).t().contiguous()

    def extra_repr(self) -> str:
        large = f", oneDNN above {self.MAX_ROWS} rows" if self.large is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, on AMX tiles{large}"


def enabled() -> bool:
    return os.environ.get("FROTA_PACKED_LINEAR", "1") != "0"


def amx_ops() -> ModuleType | None:
    """The kernels module when bfloat16 linears run on AMX tiles here: a CPU and OS that give
    them, the C++ kernels built, and `FROTA_AMX` not 0 (the kernels read it too). None
    otherwise."""
    if not enabled():
        return None
    ops = kernels.cpu_kernels()
    return ops if ops is not None and ops.amx_available() else None


def amx_takes(linear: nn.Linear) -> bool:
    """Whether `linear` can run on AMX tiles: bfloat16 and its inputs a multiple of 32."""
    return linear.weight.dtype == torch.bfloat16 and linear.in_features % 32 == 0


@functools.cache
def supported(dtype: torch.dtype) -> bool:
    """Whether packing works here and computes what F.linear computes (a one-off probe)."""
    if not (enabled() and torch.backends.mkldnn.is_available() and dtype in PACKABLE_DTYPES):
        return False
    try:
        probe = nn.Linear(64, 48, bias=True).to(dtype)
        x = torch.randn(5, 64, dtype=dtype)
        with torch.inference_mode():
            got = PackedLinear(probe)(x)
            want = F.linear(x, probe.weight, probe.bias)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        return bool(torch.allclose(got.float(), want.float(), atol=tol, rtol=tol))
    except (RuntimeError, AttributeError) as exc:
        log.warning("oneDNN weight packing unavailable (%s); using F.linear", exc)
        return False


@torch.no_grad()
def pack_linears(model: nn.Module, few_rows: Collection[str] = ("lm_head",)) -> int:
    """Replace each plain CPU `nn.Linear` of a supported dtype by an `AmxLinear` or a
    `PackedLinear`; returns how many were packed. `few_rows`: the names of the layers that
    only see a step's sampling rows. Subclasses of `nn.Linear` and other modules are left
    alone."""
    amx = amx_ops()
    targets = [
        (name, module) for name, module in model.named_modules()
        if type(module) is nn.Linear and module.weight.device.type == "cpu" and supported(module.weight.dtype)
    ]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        if amx is not None and amx_takes(module):
            packed: nn.Module = AmxLinear(module, amx, few_rows=name in few_rows)
        else:
            packed = PackedLinear(module)
        setattr(model.get_submodule(parent_name) if parent_name else model, child, packed)
    return len(targets)
