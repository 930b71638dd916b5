"""The engine on a preloaded synthetic model: tests that build many engines load the
weights once per module and hand them to each one."""

from __future__ import annotations

from typing import Any

import torch

from frota.engine import EngineArgs
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model

Loaded = tuple[str, Any]  # (model spec, what load_model returned)


def load_synthetic(spec: str) -> Loaded:
    """A synthetic model (e.g. "synthetic:dense-tiny,layers=2,seed=3") in float32 on the CPU."""
    return spec, load_model(spec, torch.float32, torch.device("cpu"), verbose=False)


def make_engine(loaded: Loaded, **kwargs: Any) -> LLMEngine:
    """A fresh engine over the preloaded weights; `kwargs` are EngineArgs fields."""
    spec, triple = loaded
    return LLMEngine(EngineArgs(model=spec, verbose=False, **kwargs), loaded=triple)
