"""Per-request sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from frota.engine.errors import InvalidRequestError
from frota.engine.grammar import Constraint


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
    prompt_logprobs: int | None = None  # top-n logprobs per prompt token (echo); bypasses the prefix cache
    presence_penalty: float = 0.0  # OpenAI: over generated tokens
    frequency_penalty: float = 0.0  # OpenAI: over generated tokens
    repetition_penalty: float = 1.0  # HF/vLLM: over prompt and generated tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens
    constraint: Constraint | None = None  # the output must match it (frota.engine.grammar)

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        # max_tokens 0 scores the prompt only (prompt logprobs), generating nothing.
        least = 0 if self.prompt_logprobs is not None else 1
        if not isinstance(self.max_tokens, int) or self.max_tokens < least:
            raise InvalidRequestError(f"max_tokens must be >= {least}, got {self.max_tokens}",
                                      "max_tokens")
        if self.temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", "temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        if self.top_k is not None and self.top_k < 1 and self.top_k != -1:
            raise InvalidRequestError("top_k must be >= 1 (or -1/None for all)", "top_k")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError("logprobs must be between 0 and 20", "logprobs")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise InvalidRequestError("prompt_logprobs must be between 0 and 20", "prompt_logprobs")
        self._validate_processing()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", "stop")

    def _validate_processing(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InvalidRequestError(f"{name} must be in [-2, 2]", name)
        if not 0 < self.repetition_penalty < float("inf"):
            raise InvalidRequestError("repetition_penalty must be > 0", "repetition_penalty")
        for token_id, bias in (self.logit_bias or {}).items():
            if not isinstance(token_id, int) or token_id < 0:
                raise InvalidRequestError("logit_bias keys must be token ids >= 0", "logit_bias")
            if not -100 <= bias <= 100:
                raise InvalidRequestError("logit_bias values must be in [-100, 100]", "logit_bias")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}]", "min_tokens")

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
