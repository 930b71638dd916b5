"""Flags that `frota generate` and `frota eval` share, from the contract's lists (torch-free)."""

from __future__ import annotations

import argparse

from frota.api.memory import KV_CACHE_DTYPES, QUANTIZATIONS


def add_quant_arguments(parser: argparse.ArgumentParser) -> None:
    """`--quantization` and `--kv-cache-dtype`."""
    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="none",
        help="weight quantization: int8 per-channel, int4 group-wise (GGUF Q4_0/Q4_1 kept "
        "as they are), fp8 e4m3 (default: none)",
    )
    parser.add_argument(
        "--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
        help="KV cache storage: auto (the model dtype), int8 or fp8 with per-token, "
        "per-head scales (about half the memory of bfloat16)",
    )
