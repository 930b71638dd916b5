"""Portable x86-64 ISA levels for prebuilt kernels, and the best one a CPU runs. No torch here.

An image cannot be compiled with `-march=native`: the build machine's CPU is not the
node's, and an instruction the node lacks kills the worker with SIGILL. So the worker
image builds its kernels once per level below (the psABI's microarchitecture levels,
plus AVX-512 BF16, which the int4 kernels use through vdpbf16ps) and the engine loads
the best level whose instructions the CPU has, read from /proc/cpuinfo's flags.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class IsaLevel:
    name: str
    cflags: tuple[str, ...]  # what replaces -march=native
    cpu_flags: frozenset[str]  # the /proc/cpuinfo flags a CPU needs to run it

    @property
    def slug(self) -> str:
        """The name as a Python identifier part (module names)."""
        return self.name.replace("-", "_")


# /proc/cpuinfo spells SSE3 "pni" and LZCNT "abm".
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}

LEVELS: tuple[IsaLevel, ...] = (  # best first
    IsaLevel("x86-64-v4-bf16", ("-march=x86-64-v4", "-mavx512bf16"), _V4 | {"avx512_bf16"}),
    IsaLevel("x86-64-v4", ("-march=x86-64-v4",), _V4),
    IsaLevel("x86-64-v3", ("-march=x86-64-v3",), _V3),
    IsaLevel("x86-64-v2", ("-march=x86-64-v2",), _V2),
)
BY_NAME = {level.name: level for level in LEVELS}

# Where /proc/cpuinfo cannot be read: torch.backends.cpu.get_cpu_capability() -> the best
# level it implies (torch's AVX2 needs AVX2 + FMA, its AVX512 F/BW/VL/DQ).
_TORCH_CAPABILITY = {"AVX512": "x86-64-v4", "AVX2": "x86-64-v3"}


def is_x86_64(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (empty if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def host_cpu_flags() -> frozenset[str] | None:
    """This CPU's flags, or None where /proc/cpuinfo is unreadable or lists none."""
    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text()) or None
    except OSError:
        return None


def parse_cpu_vendor(cpuinfo: str) -> str | None:
    """The vendor_id of the first processor in a /proc/cpuinfo text ("GenuineIntel",
    "AuthenticAMD"), or None."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return None


def host_cpu_vendor() -> str | None:
    """This CPU's vendor_id, or None where /proc/cpuinfo is unreadable."""
    try:
        return parse_cpu_vendor(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


# Where bfloat16 is the faster dtype, measured with both engines on 2-core VMs
# (docs/benchmarks.md): AMX tiles (Intel Sapphire Rapids and later), and AVX-512 BF16 on
# AMD (Zen 4 and later), whose vdpbf16ps does twice an FMA's work. On Intel CPUs with
# AVX-512 BF16 but no AMX (Cooper Lake, or a VM that hides AMX) it does no more per cycle
# than the float32 FMAs, and bfloat16 ran slower than float32; elsewhere it is emulated.
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def native_bf16(flags: frozenset[str] | None, vendor: str | None = None) -> bool:
    """Whether bfloat16 is the faster dtype on a CPU with these /proc/cpuinfo flags and vendor:
    AMX tiles, or AVX-512 BF16 on AMD."""
    flags = flags or frozenset()
    return "amx_bf16" in flags or ("avx512_bf16" in flags and vendor == "AuthenticAMD")


def runnable(flags: frozenset[str]) -> list[IsaLevel]:
    """The levels a CPU with these flags runs, best first."""
    return [level for level in LEVELS if level.cpu_flags <= flags]


def choose_level(available: Iterable[str], flags: frozenset[str] | None, *,
                 torch_capability: str | None = None, override: str | None = None) -> IsaLevel | None:
    """The best of the `available` (built) levels this CPU runs, or None.

    `flags` are the CPU's /proc/cpuinfo flags; when None, `torch_capability` (the string
    torch.backends.cpu.get_cpu_capability() returns) stands in for them. `override` names a
    level to use whatever the CPU says (FROTA_KERNELS_ISA); it must be one of `available`.
    """
    built = [level for level in LEVELS if level.name in set(available)]
    if override:
        if override not in BY_NAME:
            raise ValueError(f"unknown ISA level {override!r}; known: {', '.join(BY_NAME)}")
        return BY_NAME[override] if BY_NAME[override] in built else None
    if flags is not None:
        return next((level for level in built if level.cpu_flags <= flags), None)
    implied = _TORCH_CAPABILITY.get((torch_capability or "").upper())
    if implied is None:
        return None
    rank = LEVELS.index(BY_NAME[implied])
    return next((level for level in built if LEVELS.index(level) >= rank), None)
