"""`python -m frota.engine.kernels`: build (or load from the cache) every C++ CPU kernel now,
for this machine's CPU, so the first engine start does not pay for it. Exits 1 if a build fails.

`python -m frota.engine.kernels --prebuild DIR [--levels x86-64-v3,...]` instead builds them
for portable ISA levels into DIR (what the worker image does; see prebuilt.py); run with
FROTA_KERNELS_DIR=DIR, the engine loads the best level the CPU runs."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from frota.engine.kernels import build
from frota.engine.kernels.extensions import EXTENSIONS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frota.engine.kernels")
    parser.add_argument("--prebuild", metavar="DIR", type=Path,
                        help="build for portable ISA levels into DIR instead of for this CPU")
    parser.add_argument("--levels", help="comma-separated ISA levels for --prebuild (default: all "
                        "the compiler supports)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.prebuild:
        from frota.engine.kernels import isa, prebuilt

        start = time.monotonic()
        built = prebuilt.prebuild(args.prebuild, args.levels.split(",") if args.levels else None)
        print(f"[frota.engine] prebuilt {', '.join(built) or 'nothing'} into {args.prebuild} "
              f"in {time.monotonic() - start:.0f} s", flush=True)
        return 0 if built or not isa.is_x86_64() else 1
    ok = True
    for kind in EXTENSIONS:
        start = time.monotonic()
        print(f"[frota.engine] building the {kind} kernels ...", flush=True)
        built = build.load(kind) is not None
        ok &= built
        print(f"[frota.engine] {kind}: {'ready' if built else 'FAILED'} in {time.monotonic() - start:.0f} s",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
