"""The table of C++ extensions: which .cpp files of this directory make one Python module,
with which flags, and how one is compiled. Both ways of getting a module start here: a build
for this CPU (`build.py`) and the worker image's builds per ISA level (`prebuilt.py`).

No torch is imported until a compile needs it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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
               "prefill_attention_amx.cpp", "layer_ops.cpp", "amx_linear.cpp", "decode_stack.cpp", "lora_ops.cpp",
               "bindings.cpp"),
              (*BASE_CFLAGS, "-ffast-math", "-fopenmp"), ("-fopenmp",), "the PyTorch attention path"),
    # No -ffast-math here: it would let the compiler reorder their float32 sums (other last
    # bits). -fopenmp makes at::parallel_for split the weight rows over torch's own threads:
    # a batch-1 decode reads the weights with every core, not one.
    Extension("quant", "frota_quant", ("quant_ops.cpp",), (*BASE_CFLAGS, "-fopenmp"), ("-fopenmp",),
              "torch's ops"),
)}


def compile_extension(ext: Extension, name: str, cflags: list[str], directory: Path) -> ModuleType:
    """Compile `ext` as the module `name` with `cflags` in `directory` (or load the build there
    when it is current), and import it."""
    from torch.utils.cpp_extension import load as torch_load

    directory.mkdir(parents=True, exist_ok=True)
    return torch_load(name=name, sources=[str(path) for path in ext.paths], extra_cflags=cflags,
                      extra_ldflags=list(ext.ldflags), build_directory=str(directory), verbose=False)
