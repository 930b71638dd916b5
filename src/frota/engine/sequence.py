"""One request as the scheduler sees it: its tokens, how many have KV, and its blocks."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

import torch

from frota.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from frota.engine.grammar import Matcher
    from frota.engine.lora.adapter import LoadedAdapter


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A prompt plus its generated tokens; `num_computed_tokens` of them have KV in the cache."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        adapter: LoadedAdapter | None = None,
        matcher: Matcher | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.generator = generator
        # The LoRA adapter it runs under, held from the request's arrival to its last token
        # (an unload or a reload under the same name never changes it); None: the base model.
        self.adapter = adapter
        self.holds_slot = False  # admitted: its adapter's slot is pinned for it
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first admission)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full computed blocks
        self.num_hashed_blocks = 0
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        # params.prompt_logprobs: entry i scores prompt token i (entry 0, with no context, is None)
        self.prompt_logprobs: list = [None] if params.prompt_logprobs is not None else []
        self.matcher = matcher  # where the output stands in params.constraint's grammar
        self.keep_kv = False  # disaggregated prefill: blocks stay pinned at finish (kv_transfer)
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def lora_slot(self) -> int | None:
        """The pool slot of its adapter while admitted; None for the base model."""
        return self.adapter.slot if self.adapter is not None and self.holds_slot else None

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.matcher is not None:  # only appends advance it, so recompute never does
            self.matcher.accept(token_id)
