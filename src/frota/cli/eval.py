"""`frota eval ppl`: perplexity of a model on a text file, printed as JSON."""

from __future__ import annotations

import argparse

from frota.api.contract import ModelAlias
from frota.api.memory import DTYPES
from frota.cli.engine_flags import add_quant_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", metavar="TASK", required=True)
    ppl = sub.add_parser("ppl", help="perplexity over a text file", description="perplexity over a text file")
    ppl.add_argument("--model", default=ModelAlias.SMOLLM2)
    ppl.add_argument("--text", required=True, help="path to a UTF-8 text file")
    ppl.add_argument("--dtype", default="float32", choices=DTYPES)
    ppl.add_argument("--window", type=int, default=None,
                     help="tokens per window (default: the context length, at most 1024)")
    ppl.add_argument("--max-tokens", type=int, default=None, help="evaluate at most this many tokens")
    add_quant_arguments(ppl)


def run(args: argparse.Namespace) -> int:
    """Print {"ppl": ..., "tokens": ...}."""
    import json
    import sys

    from frota.engine import EngineArgs
    from frota.engine.eval import perplexity
    from frota.engine.llm_engine import LLMEngine

    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
        engine = LLMEngine(EngineArgs(model=args.model, dtype=args.dtype, verbose=False,
                                      quantization=args.quantization,
                                      kv_cache_dtype=args.kv_cache_dtype))
    except (OSError, ValueError) as exc:
        print(f"frota eval: {exc}", file=sys.stderr)
        return 2
    ppl, tokens = perplexity(engine, text, args.window, args.max_tokens)
    print(json.dumps({"ppl": ppl, "tokens": tokens}))
    return 0
