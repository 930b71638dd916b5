"""The offline API: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as SequenceABC

from frota.api.contract import ModelAlias
from frota.engine.config import EngineArgs
from frota.engine.llm_engine import LLMEngine
from frota.engine.outputs import CompletionOutput
from frota.engine.sampling_params import SamplingParams


class LLM:
    """Batch generation without a server: all prompts are submitted at once and stepped to the end."""

    def __init__(self, model: str = ModelAlias.SMOLLM2, **kwargs) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **kwargs))
        self.tokenizer = self.engine.tokenizer
        self._counter = 0

    def generate(
        self,
        prompts: str | SequenceABC[str | list[int]],
        params: SamplingParams | SequenceABC[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = params or SamplingParams()
        params_list = list(params) if isinstance(params, SequenceABC) else [params] * len(prompts)
        seqs = []
        for prompt, p in zip(prompts, params_list, strict=True):
            self._counter += 1
            # Validate everything before any work starts.
            seqs.append(self.engine.make_sequence(f"llm-{self._counter}", prompt, dataclasses.replace(p)))
        texts = {s.request_id: "" for s in seqs}
        logprobs: dict[str, list] = {s.request_id: [] for s in seqs}
        for seq in seqs:
            self.engine.add_sequence(seq)
        while self.engine.has_unfinished:
            for out in self.engine.step():
                texts[out.request_id] += out.new_text
                if out.new_logprobs:
                    logprobs[out.request_id].extend(out.new_logprobs)
        return [
            CompletionOutput(
                request_id=s.request_id,
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=s.token_ids[: s.num_prompt_tokens],
                text=texts[s.request_id],
                token_ids=s.generated_token_ids,
                finish_reason=s.finish_reason,
                logprobs=logprobs[s.request_id] if s.params.logprobs is not None else None,
                num_cached_tokens=s.num_cached_tokens,
                prompt_logprobs=s.prompt_logprobs if s.params.prompt_logprobs is not None else None,
            )
            for s, prompt in zip(seqs, prompts, strict=True)
        ]
