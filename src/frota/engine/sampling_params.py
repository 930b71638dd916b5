"""Per-request sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from frota.engine.errors import InvalidRequestError


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")
        if self.temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", "temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        if self.top_k is not None and self.top_k < 1 and self.top_k != -1:
            raise InvalidRequestError("top_k must be >= 1 (or -1/None for all)", "top_k")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError("logprobs must be between 0 and 20", "logprobs")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", "stop")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
