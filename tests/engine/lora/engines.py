"""Driving an engine to completion in tests: requests under adapters, tokens per request."""

from __future__ import annotations

from frota.engine import SamplingParams
from frota.engine.llm_engine import LLMEngine


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run(engine: LLMEngine, requests: list[tuple[str | None, list[int]]], max_tokens: int,
        ) -> list[list[int]]:
    """Add every (adapter, prompt ids) at once, step until done; tokens per request, in order."""
    tokens: dict[str, list[int]] = {}
    for i, (adapter, ids) in enumerate(requests):
        engine.add_request(f"r{i}", ids, greedy(max_tokens), adapter=adapter)
        tokens[f"r{i}"] = []
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return [tokens[f"r{i}"] for i in range(len(requests))]
