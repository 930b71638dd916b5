"""`frota convert MODEL DIR`: write a GGUF model as an HF-layout directory (for vLLM workers)."""

from __future__ import annotations

import argparse

from frota.api.memory import DTYPE_BYTES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a model alias (smollm2) or a .gguf file")
    parser.add_argument("directory", help="where to write config.json, model.safetensors and the tokenizer")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPE_BYTES),
                        help="element type of the written weights (default: float32, exact for dequantized GGUF)")


def run(args: argparse.Namespace) -> int:
    """Print {"directory", "architecture", "tensors", "bytes"} as JSON."""
    import json
    import sys

    from frota.engine.errors import ModelNotFoundError, UnsupportedModelError
    from frota.engine.loader.export import export_hf

    try:
        exported = export_hf(args.model, args.directory, dtype=args.dtype, verbose=False)
    except (ModelNotFoundError, UnsupportedModelError, OSError) as exc:
        print(f"frota convert: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"directory": str(exported.directory), "architecture": exported.architecture,
                      "tensors": exported.tensors, "bytes": exported.bytes}))
    return 0
