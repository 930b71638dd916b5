"""How every C++ CPU kernel is built and loaded: one table of extensions, one cache, one switch.

An extension is some of this directory's .cpp files, compiled by torch's cpp_extension into
one Python module. `load(kind)` returns it, once per process:

1. None when the kernels are switched off (`enabled`): the callers' PyTorch paths run.
2. The worker image's build for this CPU's ISA level, when `FROTA_KERNELS_DIR` names one
   (prebuilt.py, which builds them with the flags below, -march=native replaced per level).
3. Otherwise a build for this CPU (`-march=native`), compiled on first use and cached under
   `cache_root()`: one directory per extension, sources, flags, torch version and CPU, so a
   change rebuilds and nothing stale is loaded.
4. None, with a warning, where that build fails (no compiler, no headers).

No torch is imported until a build or a load needs it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

log = logging.getLogger("frota.engine.kernels")

SWITCH_ENV = "FROTA_CPU_KERNELS"  # "0": no C++ kernel at all
QUANT_SWITCH_ENV = "FROTA_QUANT_KERNELS"  # "torch": the quant kernels alone off (the older switch)
CACHE_ENV = "FROTA_KERNEL_CACHE"
SOURCE_DIR = Path(__file__).parent
BASE_CFLAGS = ("-O3", "-march=native")
HEADERS = ("kernels.h", "simd.h", "amx.h")


@dataclass(frozen=True)
class Extension:
    """One compiled module: its sources (files of this directory) and how they are compiled."""

    kind: str  # its key here, in the prebuilt manifest and in prebuilt module names
    name: str  # the module's name (a prebuilt one adds its ISA level)
    sources: tuple[str, ...]
    cflags: tuple[str, ...]  # prebuilt.py replaces -march=native by an ISA level's flags
    ldflags: tuple[str, ...]
    fallback: str  # what runs without it, for the log
    headers: tuple[str, ...] = HEADERS  # what the sources include: a change rebuilds them too

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files compiled."""
        return tuple(SOURCE_DIR / source for source in self.sources)

    @property
    def inputs(self) -> tuple[Path, ...]:
        """Every file the build reads: the sources and the headers they include."""
        return (*self.paths, *(SOURCE_DIR / header for header in self.headers))

    def source_digest(self) -> str:
        return hashlib.sha256(b"".join(path.read_bytes() for path in self.inputs)).hexdigest()[:16]


EXTENSIONS: dict[str, Extension] = {ext.kind: ext for ext in (
    Extension("attention", "frota_cpu_kernels",
              ("paged_attention.cpp", "decode_attention_avx512.cpp", "prefill_attention.cpp",
               "prefill_attention_amx.cpp", "layer_ops.cpp", "amx_linear.cpp", "decode_stack.cpp", "bindings.cpp"),
              (*BASE_CFLAGS, "-ffast-math", "-fopenmp"), ("-fopenmp",), "the PyTorch attention path"),
    # No -ffast-math here: it would let the compiler reorder their float32 sums (other last
    # bits). -fopenmp makes at::parallel_for split the weight rows over torch's own threads:
    # a batch-1 decode reads the weights with every core, not one.
    Extension("quant", "frota_quant", ("quant_ops.cpp",), (*BASE_CFLAGS, "-fopenmp"), ("-fopenmp",),
              "torch's ops"),
)}


def enabled(kind: str = "attention") -> bool:
    """Whether the `kind` kernels may be used: `FROTA_CPU_KERNELS=0` turns every one off,
    `FROTA_QUANT_KERNELS=torch` the quant ones alone."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    return not (kind == "quant" and os.environ.get(QUANT_SWITCH_ENV, "").lower() == "torch")


def cache_root() -> Path:
    """Where every Frota C++ build lives: `$FROTA_KERNEL_CACHE`, else `$XDG_CACHE_HOME/frota/kernels`
    (`~/.cache/frota/kernels`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frota" / "kernels"


def cpu_flags() -> str:
    """The CPU's feature flags: a `-march=native` build is only reused on a like CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_directory(ext: Extension) -> Path:
    """The cache directory of `ext`'s build for this CPU."""
    import torch

    key = hashlib.sha256()
    for path in ext.inputs:
        key.update(path.read_bytes())
    key.update(" ".join((*ext.cflags, *ext.ldflags, torch.__version__, platform.machine(),
                         cpu_flags())).encode())
    return cache_root() / f"{ext.name}-{key.hexdigest()[:16]}"


def compile_extension(ext: Extension, name: str, cflags: list[str], directory: Path) -> ModuleType:
    """Compile `ext` as the module `name` with `cflags` in `directory` (or load the build there
    when it is current), and import it."""
    from torch.utils.cpp_extension import load as torch_load

    directory.mkdir(parents=True, exist_ok=True)
    return torch_load(name=name, sources=[str(path) for path in ext.paths], extra_cflags=cflags,
                      extra_ldflags=list(ext.ldflags), build_directory=str(directory), verbose=False)


def is_built(kind: str = "attention") -> bool:
    """Whether `load(kind)` will find a prebuilt or cached build rather than compile."""
    from frota.engine.kernels import prebuilt

    return prebuilt.path(kind) is not None or any(build_directory(EXTENSIONS[kind]).glob("*.so"))


_loaded: dict[str, ModuleType | None] = {}


def load(kind: str) -> ModuleType | None:
    """The `kind` kernels module (see the module docstring), or None; decided once per process."""
    if kind not in _loaded:
        _loaded[kind] = _load(EXTENSIONS[kind])
    return _loaded[kind]


def _load(ext: Extension) -> ModuleType | None:
    if not enabled(ext.kind):
        log.info("the C++ %s kernels are switched off; using %s", ext.kind, ext.fallback)
        return None
    from frota.engine.kernels import prebuilt

    module = prebuilt.load(ext.kind)
    if module is not None:
        return module
    try:
        return compile_extension(ext, ext.name, list(ext.cflags), build_directory(ext))
    except Exception as exc:  # no compiler, no headers, a failed build: fall back, loudly
        log.warning("C++ %s kernels unavailable, using %s: %s", ext.kind, ext.fallback, exc)
        return None
