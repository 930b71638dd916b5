"""The engine as the server sees it: one typing protocol over the engine's plain data.

The server imports only `frota.engine`'s torch-free modules (`SamplingParams`,
`RequestOutput`, `EngineStats`, `InvalidRequestError`, `Constraint`, and LoRA's
`AdapterError` and `AdapterInfo` from `frota.engine.lora`) and receives a
started engine that fits `OnlineEngine`: `frota.engine.AsyncEngine` in `frota worker`
(built in `cli.run`), or a test double without torch (tests/server/fake_engine.py).
tests/server/test_engine_boundary.py checks both against the protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from frota.engine.lora import AdapterInfo
from frota.engine.outputs import EngineStats, RequestOutput
from frota.engine.sampling_params import SamplingParams


class Tokenizer(Protocol):
    """The engine tokenizer's surface used by the server."""

    eos_token_ids: Sequence[int]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, messages: list[dict[str, str]]) -> str: ...


class OnlineEngine(Protocol):
    """The online engine (`frota.engine.AsyncEngine`)."""

    tokenizer: Tokenizer
    max_model_len: int

    @property
    def is_running(self) -> bool: ...  # False once the step loop has died: the pod restarts

    # `adapter`: a loaded LoRA adapter's name (None: the base model); AdapterError
    # (code "adapter_not_found") when it is not loaded.
    def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                 adapter: str | None = None) -> AsyncIterator[RequestOutput]: ...
    def abort(self, request_id: str) -> None: ...
    def stats(self) -> EngineStats: ...
    # LoRA: each raises AdapterError (with `.code`) naming what is wrong; nothing else changes.
    async def load_adapter(self, name: str, path: str) -> AdapterInfo: ...
    async def unload_adapter(self, name: str) -> None: ...
    async def adapters(self) -> list[AdapterInfo]: ...
    async def start(self) -> None: ...
    async def shutdown(self) -> None: ...


@dataclass
class EngineBindings:
    """A started engine, and whether it can constrain its output to a grammar."""

    engine: OnlineEngine
    # False: the engine has no constrained decoding, and response_format / forced tool calls
    # are refused with a 400.
    constrained_decoding: bool = False
