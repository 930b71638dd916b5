"""SmolLM2 in float32: greedy tokens under two PEFT adapters (different ranks, targets and
scaling) equal transformers + PEFT's, alone and in one mixed batch with base-model requests;
a long prompt under an adapter and then under the base model each get their own answer
(the prefix cache is keyed by adapter)."""

from __future__ import annotations

import pytest

from frota.engine import EngineArgs
from frota.engine.llm_engine import LLMEngine
from tests.engine.lora.engines import greedy, run

pytestmark = pytest.mark.slow

NUM_TOKENS = 12
PROMPTS = ["The capital of France is", "def fib(n):", "Kubernetes is an open-source system for"]
LONG = ("You are a careful assistant. Answer in plain English, with short sentences and no "
        "lists. Question: why is the sky blue on a clear day? Answer:")


@pytest.fixture(scope="module")
def engine(smollm2_loaded, peft_smollm2) -> LLMEngine:
    _, dirs = peft_smollm2
    engine = LLMEngine(EngineArgs(model="smollm2", dtype="float32", verbose=False,
                                  num_kv_blocks=128, max_loras=2, max_lora_rank=8),
                       loaded=smollm2_loaded)
    for name, path in dirs.items():
        engine.load_adapter(name, str(path))
    return engine


@pytest.fixture(scope="module")
def ids(engine) -> list[list[int]]:
    return [engine.tokenizer.encode(p) for p in PROMPTS]


@pytest.mark.parametrize("adapter", ["a", "b"])
def test_an_adapter_alone_gives_transformers_peft_tokens(engine, ids, reference_greedy, adapter):
    got = run(engine, [(adapter, ids[0])], NUM_TOKENS)
    assert got == [reference_greedy(adapter, ids[0], NUM_TOKENS)]


def test_each_adapter_changes_the_output(ids, reference_greedy):
    base = reference_greedy(None, ids[0], NUM_TOKENS)
    assert reference_greedy("a", ids[0], NUM_TOKENS) != base
    assert reference_greedy("b", ids[0], NUM_TOKENS) != base


def test_a_mixed_batch_gives_each_request_its_own_models_tokens(engine, ids, reference_greedy):
    requests = [("a", ids[0]), (None, ids[0]), ("b", ids[0]), ("b", ids[1]), (None, ids[2]),
                ("a", ids[2])]
    got = run(engine, requests, NUM_TOKENS)
    want = [reference_greedy(adapter, p, NUM_TOKENS) for adapter, p in requests]
    assert got == want


def test_a_prefix_computed_under_an_adapter_never_serves_the_base_model(engine, reference_greedy):
    long_ids = engine.tokenizer.encode(LONG)
    assert len(long_ids) >= 2 * engine.args.block_size  # a full block to share
    hits = []
    for adapter in ("a", None, "b", "a"):
        engine.add_request("long", long_ids, greedy(NUM_TOKENS), adapter=adapter)
        tokens, cached = [], 0
        while engine.has_unfinished:
            for out in engine.step():
                tokens.extend(out.new_token_ids)
                cached = out.num_cached_tokens
        assert tokens == reference_greedy(adapter, long_ids, NUM_TOKENS), adapter
        hits.append(cached)
    # the base model and "b" find nothing of "a"'s KV; "a" again finds its own
    assert hits[1] == 0 and hits[2] == 0 and hits[3] > 0, hits
