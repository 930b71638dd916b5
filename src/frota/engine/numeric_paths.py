"""Which numeric paths are in effect, as one line: what a test that compares numbers prints.

The same model computes slightly different numbers on different CPUs and under different
switches: the ISA level the C++ kernels were built for (`-march=native`, or a prebuilt level,
`FROTA_KERNELS_ISA`), whether those kernels run at all (`FROTA_CPU_KERNELS`), whether the
linears are packed for oneDNN (`FROTA_PACKED_LINEAR`) and whether bfloat16 runs on AMX tiles
(`FROTA_AMX`). A numeric assertion names them, so a failure on another machine says which
path it ran.
"""

from __future__ import annotations

import collections
import os
from typing import TYPE_CHECKING

from frota.engine.kernels import build, isa, prebuilt

if TYPE_CHECKING:
    from torch import nn

SWITCHES = ("FROTA_CPU_KERNELS", "FROTA_QUANT_KERNELS", "FROTA_PACKED_LINEAR", "FROTA_AMX",
            prebuilt.DIR_ENV, prebuilt.ISA_ENV)


def cpu_summary() -> str:
    """The CPU's vendor, the best portable ISA level it runs, and whether it has AMX tiles."""
    flags = isa.host_cpu_flags()
    if flags is None:
        return "cpu flags unknown"
    levels = isa.runnable(flags)
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    return f"{isa.host_cpu_vendor() or 'unknown vendor'} {levels[0].name if levels else 'below x86-64-v2'}, {amx}"


def kernels_summary() -> str:
    """Whether the C++ kernels run, built for which ISA level, and whether they use AMX tiles."""
    from frota.engine import kernels

    if not build.enabled("attention"):
        return "C++ kernels off (FROTA_CPU_KERNELS=0)"
    module = kernels.cpu_kernels()
    if module is None:
        return "C++ kernels unavailable (no compiler?)"
    level = prebuilt.chosen_level() if prebuilt.path("attention") is not None else None
    built = f"prebuilt {level}" if level else "-march=native"
    quant = "quant kernels " + ("on" if build.load("quant") is not None else "off")
    amx = "AMX tiles " + ("on" if module.amx_available() else "off")
    return f"C++ kernels {built}, {quant}, {amx} (LoRA decode rows: the C++ gather)"


def linears_summary(model: nn.Module) -> str:
    """How many of `model`'s linear layers take each path: oneDNN-packed, AMX, plain
    `F.linear`, or a quantized layer (by its class)."""
    from torch import nn

    from frota.engine.kernels.linear import AmxLinear, PackedLinear
    from frota.engine.quant.linear import QuantLinear

    names = {PackedLinear: "oneDNN-packed", AmxLinear: "AMX", nn.Linear: "plain"}
    # an AmxLinear's oneDNN copy (for long prefill chunks) is part of that layer, not another
    inner = {id(m.large) for m in model.modules() if isinstance(m, AmxLinear)}
    counts: collections.Counter[str] = collections.Counter(
        names.get(type(m), type(m).__name__) for m in model.modules()
        if isinstance(m, (PackedLinear, AmxLinear, nn.Linear, QuantLinear))
        and id(m) not in inner)
    return "linears " + (", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none")


def describe(model: nn.Module | None = None) -> str:
    """One line: the CPU, the kernels in effect, the switches set and, given a loaded model,
    which path its linears take and its dtype."""
    parts = [cpu_summary(), kernels_summary()]
    if model is not None:
        import torch

        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        dtype = str(param.dtype if param is not None else torch.get_default_dtype()).removeprefix("torch.")
        parts.append(f"{linears_summary(model)}, {dtype}")
    switches = [f"{name}={os.environ[name]}" for name in SWITCHES if name in os.environ]
    parts.append(" ".join(switches) if switches else "no switches set")
    return "; ".join(parts)
