"""`frota generate`: generate text offline with the engine."""

from __future__ import annotations

import argparse

from frota.api.contract import ModelAlias
from frota.api.memory import DTYPES
from frota.cli.engine_flags import add_quant_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=ModelAlias.SMOLLM2, help="alias, .gguf path, HF dir or synthetic:...")
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    parser.add_argument("--ignore-eos", action="store_true")
    add_quant_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Load the model, generate for one prompt, print the text."""
    import sys

    from frota.engine import (
        LLM,
        InvalidRequestError,
        ModelNotFoundError,
        SamplingParams,
        UnsupportedModelError,
    )

    try:
        llm = LLM(model=args.model, dtype=args.dtype, quantization=args.quantization,
                  kv_cache_dtype=args.kv_cache_dtype)
        prompt = args.prompt
        if args.chat:
            prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                seed=args.seed, ignore_eos=args.ignore_eos)
        out = llm.generate([prompt], params)[0]
    except (InvalidRequestError, ModelNotFoundError, UnsupportedModelError, ValueError) as exc:
        print(f"frota generate: {exc}", file=sys.stderr)
        return 2
    print(out.text)
    return 0
