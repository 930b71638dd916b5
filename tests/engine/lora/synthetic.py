"""A tiny synthetic model and adapters for it: the fast tests' base (no download, no
transformers), with references from the engine itself, one request at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from frota.engine import EngineArgs
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model
from tests.engine.lora.adapters import write_adapter

SPEC = "synthetic:dense-tiny,layers=2,seed=3"
NUM_TOKENS = 8


def load() -> tuple:
    return load_model(SPEC, torch.float32, torch.device("cpu"), verbose=False)


def make_engine(loaded: tuple, **kwargs: Any) -> LLMEngine:
    kwargs = {"num_kv_blocks": 64, "max_loras": 2, "max_lora_rank": 8, **kwargs}
    return LLMEngine(EngineArgs(model=SPEC, verbose=False, **kwargs), loaded=loaded)


def prompts(num: int, length: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, 250, (length + i,), generator=g).tolist() for i in range(num)]


def make_adapters(root: Path, shape, count: int = 3) -> dict[str, Path]:
    """`count` adapters named a0, a1, ... with different ranks and targets."""
    kinds = [(8, ["q_proj", "v_proj", "down_proj"]), (4, ["k_proj", "o_proj", "gate_proj", "up_proj"]),
             (2, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])]
    out = {}
    for i in range(count):
        rank, targets = kinds[i % len(kinds)]
        out[f"a{i}"] = write_adapter(root / f"a{i}", shape, rank=rank, targets=targets, seed=i,
                                     alpha=2 * rank, rslora=i % 2 == 1, scale=0.5)
    return out
