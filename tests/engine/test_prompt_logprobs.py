"""Prompt logprobs (echo) against a naive forward: chunked prefill, prefix cache, preemption."""

from __future__ import annotations

import pytest
import torch

from frota.engine import SamplingParams
from frota.engine.errors import InvalidRequestError
from frota.engine.llm_engine import LLMEngine
from tests.engine.synthetic import load_synthetic, make_engine

from .reference import reference_logits

PROMPT = list(range(40, 77))


@pytest.fixture(scope="module")
def loaded():
    return load_synthetic("synthetic:dense-tiny,layers=2,seed=3")


def expected(loaded, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(reference_logits(loaded[1][0], ids), -1)


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]):
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params)
    outs: dict[str, list] = {rid: [] for rid in requests}
    while engine.has_unfinished:
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def check(loaded, outs: list, ids: list[int], top: int) -> None:
    ref = expected(loaded, ids)
    scores = outs[0].prompt_logprobs
    assert all(o.prompt_logprobs is None for o in outs[1:])  # sent once
    assert len(scores) == len(ids) and scores[0] is None
    for i, entry in enumerate(scores[1:], start=1):
        assert entry.token_id == ids[i]
        assert entry.logprob == pytest.approx(float(ref[i - 1, ids[i]]), abs=1e-4)
        assert list(entry.top_logprobs) == ref[i - 1].topk(top).indices.tolist()


@pytest.mark.parametrize("engine_kwargs", [
    dict(num_kv_blocks=64, block_size=4),
    dict(num_kv_blocks=64, block_size=4, max_num_batched_tokens=7),  # chunked prefill
], ids=["whole", "chunked"])
def test_prompt_logprobs_match_a_naive_forward(loaded, engine_kwargs) -> None:
    engine = make_engine(loaded, **engine_kwargs)
    outs = run(engine, {
        "echo": (PROMPT, SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2)),
        "plain": ([5, 17, 99, 3], SamplingParams(max_tokens=3, temperature=0)),
    })
    check(loaded, outs["echo"], PROMPT, 2)
    assert all(o.prompt_logprobs is None for o in outs["plain"])
    assert sum(len(o.new_token_ids) for o in outs["echo"]) == 3


def test_a_prefix_cache_hit_does_not_skip_the_scored_positions(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    run(engine, {"warm": (PROMPT, SamplingParams(max_tokens=1, temperature=0))})
    outs = run(engine, {"echo": (PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=1))})
    check(loaded, outs["echo"], PROMPT, 1)
    assert outs["echo"][0].num_cached_tokens == 0
    # ... and its blocks still serve later requests.
    again = run(engine, {"again": (PROMPT, SamplingParams(max_tokens=1, temperature=0))})
    assert again["again"][0].num_cached_tokens > 0


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    outs = run(engine, {"score": (PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=0))})
    (out,) = outs["score"]
    assert out.finished and out.finish_reason == "length"
    assert out.new_token_ids == [] and out.num_generated_tokens == 0
    assert len(out.prompt_logprobs) == len(PROMPT)
    assert out.prompt_logprobs[1].top_logprobs == {}


def test_preempted_echo_request_scores_each_position_once(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=14, block_size=4, max_num_batched_tokens=16)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = run(engine, {
        "echo": (PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                        prompt_logprobs=1)),
        "b": (list(range(100, 118)), greedy),
    })
    assert engine.scheduler.num_preemptions > 0
    check(loaded, outs["echo"], PROMPT, 1)


def test_logit_bias_outside_the_vocabulary_is_refused(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=16)
    vocab = engine.model_config.vocab_size
    with pytest.raises(InvalidRequestError) as exc:
        engine.add_request("r", [1, 2], SamplingParams(logit_bias={vocab: 1.0}))
    assert exc.value.param == "logit_bias"
