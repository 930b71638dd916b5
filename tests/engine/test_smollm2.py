"""SmolLM2-135M (GGUF Q4_1, dequantized to float32) against `transformers` on the same file:
prefill logits and 64-token greedy generations, under batching, chunked prefill, prefix caching
and preemption. The transformers outputs are computed once per session.

Exact greedy equality holds here because both sides compute the same float32 model the same
way up to summation orders: the engine runs the plain path (its linears `F.linear`, as
transformers' are; an engine given `loaded` packs nothing for oneDNN), so the logits differ
by ~1e-4, far below the margins of these continuations. The packed, bfloat16 and quantized
paths are judged teacher-forced instead (tests/engine/quant/test_smollm2_quant.py), and this
comparison runs under every kernel switch in tests/engine/test_numeric_paths.py."""

from __future__ import annotations

import pytest
import torch

from frota.engine import EngineArgs, SamplingParams
from frota.engine import numeric_paths as paths
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence

pytestmark = pytest.mark.slow

NUM_TOKENS = 64
SYSTEM = "You are a careful assistant. Answer in plain English, with short sentences and no lists. "
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Here is a Python function that returns the n-th Fibonacci number:\n\ndef fib(n):",
    "The three primary colors are",
    SYSTEM + "Question: why is the sky blue? Answer:",
    SYSTEM + "Question: how do plants make their food? Answer:",
    "Kubernetes is an open-source system for automating deployment, scaling, and",
    "List of the planets of the solar system, ordered by distance from the sun: Mercury,",
]


@pytest.fixture(scope="module")
def hf(hf_smollm2):
    return hf_smollm2


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    """Frota's float32 on the plain path (no oneDNN packing: see the module docstring)."""
    loaded = load_model("smollm2", torch.float32, torch.device("cpu"), verbose=False)
    return LLMEngine(EngineArgs(model="smollm2", dtype="float32", verbose=False, num_kv_blocks=256),
                     loaded=loaded)


@pytest.fixture(scope="module")
def prompt_ids(engine) -> list[list[int]]:
    return [engine.tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_greedy(hf, engine, prompt_ids) -> list[list[int]]:
    eos = engine.tokenizer.eos_token_ids[0]
    outs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
            outs.append(out[0, len(ids):].tolist())
    return outs


def engine_with(engine: LLMEngine, **kwargs) -> LLMEngine:
    return LLMEngine(EngineArgs(model="smollm2", dtype="float32", verbose=False, **kwargs),
                     loaded=engine.loaded)


def generate(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]):
    outs: dict[str, list[int]] = {}
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", ids, p)
        outs[f"r{i}"] = []
    while engine.has_unfinished:
        for out in engine.step():
            outs[out.request_id] += out.new_token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [outs[f"r{i}"] for i in range(len(prompts))]


def assert_same_as_hf(got: list[int], expected: list[int], engine: LLMEngine) -> None:
    # transformers pads after EOS; the engine stops there (and includes the EOS).
    assert got == expected[: len(got)], f"paths: {paths.describe(engine.runner.model)}"
    assert len(got) == NUM_TOKENS or got[-1] == 2


GREEDY = SamplingParams(max_tokens=NUM_TOKENS, temperature=0)


def test_prefill_logits_match_transformers(engine, hf, prompt_ids):
    runner = engine.runner
    chosen = prompt_ids[:3]
    seqs = [Sequence(f"p{i}", ids, GREEDY) for i, ids in enumerate(chosen)]
    for s in seqs:
        engine.block_manager.append_slots(s, s.num_tokens)
    input_ids, positions, meta, _, _ = runner.prepare(ScheduledBatch(seqs, [len(x) for x in chosen]))
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(input_ids, positions, runner.kv_caches, meta))
        row = 0
        for ids in chosen:
            expected = hf(torch.tensor([ids])).logits[0].float()
            diff = (logits[row : row + len(ids)] - expected).abs().max().item()
            assert diff < 1e-3, f"max abs logit difference {diff}; paths: {paths.describe(runner.model)}"
            row += len(ids)
    for s in seqs:
        engine.block_manager.deallocate(s)


def test_greedy_matches_transformers_batched_with_other_requests(engine, prompt_ids, hf_greedy):
    fillers = [list(range(1000, 1000 + n)) for n in (3, 90, 17)]
    params = [GREEDY] * len(prompt_ids) + [
        SamplingParams(max_tokens=n, temperature=0.8, seed=n) for n in (5, 40, 70)
    ]
    outs = generate(engine_with(engine, num_kv_blocks=256), prompt_ids + fillers, params)
    for got, expected in zip(outs, hf_greedy, strict=False):
        assert_same_as_hf(got, expected, engine)


def test_greedy_matches_transformers_with_small_prefill_chunks(engine, prompt_ids, hf_greedy):
    small = engine_with(engine, num_kv_blocks=256, max_num_batched_tokens=16, block_size=8)
    outs = generate(small, prompt_ids, [GREEDY] * len(prompt_ids))
    for got, expected in zip(outs, hf_greedy, strict=True):
        assert_same_as_hf(got, expected, engine)


def test_greedy_matches_transformers_with_prefix_cache_hits(engine, prompt_ids, hf_greedy):
    cached = engine_with(engine, num_kv_blocks=256, block_size=4)
    # Warm the cache with the prompts alone (prompts 4 and 5 also share SYSTEM).
    generate(cached, prompt_ids[:5], [SamplingParams(max_tokens=1, temperature=0)] * 5)
    hits_before = cached.block_manager.prefix_cache_hits
    outs = generate(cached, prompt_ids, [GREEDY] * len(prompt_ids))
    assert cached.block_manager.prefix_cache_hits > hits_before
    for got, expected in zip(outs, hf_greedy, strict=True):
        assert_same_as_hf(got, expected, engine)


def test_greedy_matches_transformers_after_preemption(engine, prompt_ids, hf_greedy):
    tight = engine_with(engine, num_kv_blocks=24, block_size=8, enable_prefix_caching=False)
    outs = generate(tight, prompt_ids, [GREEDY] * len(prompt_ids))
    assert tight.scheduler.num_preemptions > 0
    for got, expected in zip(outs, hf_greedy, strict=True):
        assert_same_as_hf(got, expected, engine)
