"""`python -m frota.engine.kernels`: build (or load from the cache) every C++ CPU kernel now,
so the first engine start does not pay for it. Exits 1 if a build fails."""

from __future__ import annotations

import logging
import sys
import time

from frota.engine import kernels
from frota.engine.quant import cpu_kernels as quant_kernels


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ok = True
    for name, build in (("paged attention", kernels.cpu_kernels), ("int8/int4 matmul", quant_kernels.kernels)):
        start = time.monotonic()
        print(f"[frota.engine] building the {name} kernels ...", flush=True)
        built = build() is not None
        ok &= built
        print(f"[frota.engine] {name}: {'ready' if built else 'FAILED'} in {time.monotonic() - start:.0f} s",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
