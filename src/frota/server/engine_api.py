"""What the server needs from the engine (docs/internals.md), as typing protocols.

The server never imports `frota.engine` outside `cli.run`: it receives an
`EngineBindings` (the engine plus the two engine classes it uses), so tests can
bind a fake engine without torch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Tokenizer(Protocol):
    """The engine tokenizer's surface used by the server."""

    eos_token_ids: Sequence[int]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, messages: list[dict[str, str]]) -> str: ...


class EngineOutput(Protocol):
    """One delta from `AsyncEngine.generate`."""

    new_token_ids: Sequence[int]
    new_text: str
    new_logprobs: Any
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_generated_tokens: int
    num_cached_tokens: int


class EngineStats(Protocol):
    """`AsyncEngine.stats()`."""

    num_running: int
    num_waiting: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    block_size: int
    prefix_cache_queries: int
    prefix_cache_hits: int


class Engine(Protocol):
    """The online engine (`frota.engine.AsyncEngine`)."""

    tokenizer: Tokenizer
    max_model_len: int

    def generate(
        self, request_id: str, prompt: str | list[int], params: Any
    ) -> AsyncIterator[EngineOutput]: ...
    def abort(self, request_id: str) -> None: ...
    def stats(self) -> EngineStats: ...
    async def shutdown(self) -> None: ...


@dataclass
class EngineBindings:
    """A started engine plus the engine classes the server constructs or catches."""

    engine: Engine
    sampling_params: Callable[..., Any]
    invalid_request_error: type[BaseException]
    model_name: str = ""
    # (kind, text) -> the engine's grammar constraint (frota.engine.Constraint); None: the
    # engine has no constrained decoding, and response_format / forced tool calls are refused.
    constraint: Callable[[str, str], Any] | None = None
