"""Frota's PyTorch inference engine: paged KV cache, continuous batching, chunked prefill,
prefix caching. See docs/internals.md for the contract."""

from frota.engine.config import EngineArgs, ModelConfig
from frota.engine.errors import InvalidRequestError, ModelNotFoundError, UnsupportedModelError
from frota.engine.grammar import Constraint
from frota.engine.lora.errors import AdapterError, AdapterInfo
from frota.engine.outputs import CompletionOutput, EngineStats, RequestOutput, TokenLogprob
from frota.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AdapterError",
    "AdapterInfo",
    "AsyncEngine",
    "CompletionOutput",
    "Constraint",
    "EngineArgs",
    "EngineStats",
    "InvalidRequestError",
    "LLMEngine",
    "ModelConfig",
    "ModelNotFoundError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
    "UnsupportedModelError",
]


def __getattr__(name: str):
    # The torch-backed classes load lazily, so `import frota.engine` stays cheap.
    if name == "LLM":
        from frota.engine.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from frota.engine.async_engine import AsyncEngine

        return AsyncEngine
    if name == "LLMEngine":
        from frota.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
