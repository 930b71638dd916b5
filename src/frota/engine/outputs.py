"""What the engine hands back: per-step deltas, whole completions, and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    """The log-probability of a generated token and of the top-n alternatives at its position."""

    token_id: int
    logprob: float
    top_logprobs: dict[int, float] = field(default_factory=dict)


@dataclass
class RequestOutput:
    """The delta of one request since its last output (what `AsyncEngine.generate` yields)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    num_prompt_tokens: int
    num_generated_tokens: int
    num_cached_tokens: int
    # With the first output of a request that asked for them: one entry per prompt token
    # (the first, which has no context, is None).
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class CompletionOutput:
    """A finished request (what `LLM.generate` returns)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None
    num_cached_tokens: int
    prompt_logprobs: list[TokenLogprob | None] | None = None  # params.prompt_logprobs


@dataclass
class EngineStats:
    """A snapshot of the engine for metrics and load balancing."""

    num_running: int
    num_waiting: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    block_size: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int = 0
    # MoE under expert parallelism: (layer, expert) -> routed (token, slot) pairs so far
    expert_tokens: dict[tuple[int, int], int] = field(default_factory=dict)
    # LoRA (vLLM's vllm:lora_requests_info): the adapters of running and of waiting requests,
    # and the slots (0: LoRA off)
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    max_adapters: int = 0

    @property
    def kv_cache_usage(self) -> float:
        return self.num_kv_blocks_used / max(1, self.num_kv_blocks_total)
