"""Where an engine computes and in what: its device, its dtype, and on the CPU the kernels that
compute it (linears packed for oneDNN, the C++ kernels built), with the start-up line that
says so."""

from __future__ import annotations

import itertools

import torch

from frota.engine import kernels
from frota.engine.kernels import isa
from frota.engine.kernels.linear import amx_ops, pack_linears
from frota.engine.progress import progress

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a loaded model's weights live (the KV cache must be there too)."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def resolve_dtype(dtype: str, device: torch.device, cpu_flags: frozenset[str] | None = None,
                  cpu_vendor: str | None = None) -> torch.dtype:
    """`auto`: bfloat16 on an accelerator and on a CPU where it is the faster dtype (AMX
    tiles, or AVX-512 BF16 on AMD: `isa.native_bf16`; `cpu_flags` and `cpu_vendor`, default
    this CPU's), float32 on other CPUs."""
    if dtype == "auto":
        if device.type != "cpu":
            return torch.bfloat16
        flags = isa.host_cpu_flags() if cpu_flags is None else cpu_flags
        vendor = isa.host_cpu_vendor() if cpu_flags is None else cpu_vendor
        return torch.bfloat16 if isa.native_bf16(flags, vendor) else torch.float32
    if dtype == "float16" and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[dtype]


def prepare_cpu(model: torch.nn.Module, device: torch.device, verbose: bool) -> None:
    """On the CPU, before the KV cache is sized from the memory left: pack `model`'s float
    linears for oneDNN (their packed copies are memory too) and build the C++ kernels."""
    if device.type != "cpu":
        return
    packed = pack_linears(model)
    if packed:
        progress(verbose, f"packed {packed} linear layers for oneDNN")
    if kernels.enabled() and not kernels.is_built():
        progress(verbose, "compiling the C++ CPU kernels (first use on this machine, about a minute)")
    if kernels.cpu_kernels() is None:
        progress(verbose, "C++ CPU kernels unavailable: using the PyTorch attention path")


def describe_compute(asked: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype chosen, why, and what computes it: one start-up line."""
    name = str(dtype).removeprefix("torch.")
    if asked == "auto" and device.type == "cpu":
        flags = isa.host_cpu_flags() or frozenset()
        if "amx_bf16" in flags:
            why = "auto: this CPU has AMX tiles"
        elif "avx512_bf16" in flags:
            why = ("auto: this AMD CPU has AVX-512 BF16" if dtype == torch.bfloat16 else
                   "auto: this CPU has AVX-512 BF16 but no AMX, where float32 runs faster")
        else:
            why = "auto: this CPU has no native bfloat16"
        name = f"{name} ({why})"
    elif asked == "auto":
        name = f"{name} (auto: {device.type})"
    if device.type != "cpu":
        return name
    matmuls = "; bfloat16 matmuls on AMX tiles" if dtype == torch.bfloat16 and amx_ops() else ""
    return f"{name}; {kernels.describe()}{matmuls}"
