"""The batched, paged path against a naive per-sequence forward, on synthetic dense and MoE models."""

from __future__ import annotations

import pytest
import torch

from frota.engine import SamplingParams
from frota.engine.llm_engine import LLMEngine
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence
from tests.engine.synthetic import load_synthetic, make_engine

from .reference import reference_greedy, reference_logits

PROMPTS = [
    [5, 17, 99, 3],
    list(range(40, 77)),
    [200, 201] * 9,
    list(range(100, 131)),
    [42],
]


@pytest.fixture(scope="module", params=["moe-tiny", "dense-tiny"])
def loaded(request):
    return load_synthetic(f"synthetic:{request.param},layers=2,seed=3")


def test_a_preloaded_model_keeps_its_device_when_a_gpu_is_visible(loaded, monkeypatch):
    # device "auto" picks CUDA when one is visible; weights loaded on the CPU must still
    # be served from the CPU, with the KV cache beside them, not moved under them.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine = make_engine(loaded, num_kv_blocks=16)
    assert engine.device.type == "cpu" and engine.dtype == torch.float32
    engine.add_request("r", PROMPTS[1], SamplingParams(max_tokens=3, temperature=0))
    while engine.has_unfinished:
        engine.step()


def run_all(engine: LLMEngine, prompts, params_list):
    ids = []
    for i, (p, params) in enumerate(zip(prompts, params_list, strict=True)):
        engine.add_request(f"r{i}", p, params)
        ids.append(f"r{i}")
    tokens: dict[str, list[int]] = {r: [] for r in ids}
    logprobs: dict[str, list[float]] = {r: [] for r in ids}
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            logprobs[out.request_id] += [lp.logprob for lp in out.new_logprobs or []]
    return [tokens[r] for r in ids], [logprobs[r] for r in ids]


def test_batched_paged_prefill_logits_equal_reference(loaded):
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    runner = engine.runner
    seqs = [Sequence(f"s{i}", p, SamplingParams()) for i, p in enumerate(PROMPTS)]
    for s in seqs:
        engine.block_manager.append_slots(s, s.num_tokens)
    batch = ScheduledBatch(seqs, [s.num_tokens for s in seqs])
    input_ids, positions, meta, _, _ = runner.prepare(batch)
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.model(input_ids, positions, runner.kv_caches, meta))
    # prepare() puts single-token (decode-path) sequences first
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].num_tokens != 1)
    row = 0
    for i in order:
        n = seqs[i].num_tokens
        expected = reference_logits(runner.model, PROMPTS[i])
        torch.testing.assert_close(logits[row : row + n], expected, atol=1e-4, rtol=1e-4)
        row += n


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        dict(num_kv_blocks=64, block_size=4),  # plain continuous batching
        dict(num_kv_blocks=64, block_size=4, max_num_batched_tokens=7),  # chunked prefill + decodes
        dict(num_kv_blocks=14, block_size=4, max_num_batched_tokens=16),  # preemption
    ],
    ids=["batched", "chunked", "preempted"],
)
def test_greedy_generation_equals_reference(loaded, engine_kwargs):
    engine = make_engine(loaded, **engine_kwargs)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)
    prompts = [*PROMPTS, PROMPTS[1][:20]]  # the last one hits the prefix cache of the second
    tokens, logprobs = run_all(engine, prompts, [params] * len(prompts))
    model = engine.runner.model
    for p, got, lps in zip(prompts, tokens, logprobs, strict=True):
        expected = reference_greedy(model, p, 10)
        assert got == expected
        ref_lp = torch.log_softmax(reference_logits(model, p + got[:-1])[len(p) - 1 :], -1)
        ref_chosen = ref_lp[torch.arange(len(got)), torch.tensor(got)]
        torch.testing.assert_close(torch.tensor(lps), ref_chosen, atol=1e-4, rtol=1e-4)
    if "max_num_batched_tokens" not in engine_kwargs:
        # all admitted in one step: the last prompt shares blocks the second is filling in it
        assert engine.block_manager.prefix_cache_hits == 16
    if "max_num_batched_tokens" in engine_kwargs and engine_kwargs["num_kv_blocks"] < 20:
        assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("spec", ["dense-tiny", "moe-small,layers=6,max_len=4096",
                                  "hidden=128,heads=4,kv_heads=1,tie=1", "moe-tiny,top_k=1"])
def test_the_planner_reads_the_shape_the_engine_builds(spec):
    from frota.engine.loader.synthetic import parse_spec
    from frota.plan.model_shapes import synthetic_shape

    config, _ = parse_spec(spec)
    shape = synthetic_shape(spec)
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
            shape.head_dim, shape.intermediate_size, shape.vocab_size,
            shape.max_position, shape.tie_word_embeddings, shape.num_experts) == (
        config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
        config.head_dim, config.intermediate_size, config.vocab_size, config.max_position,
        config.tie_word_embeddings, config.num_experts)


@pytest.mark.parametrize("spec", ["huge", "vocab=100", "heads=4,kv_heads=3", "layers=x", "bad=1"])
def test_a_bad_spec_is_refused_alike_by_the_planner_and_the_engine(spec):
    from frota.engine.errors import ModelNotFoundError
    from frota.engine.loader.synthetic import parse_spec
    from frota.plan.model_shapes import UnknownModelError, synthetic_shape

    with pytest.raises(ModelNotFoundError) as engine:
        parse_spec(spec)
    with pytest.raises(UnknownModelError) as planner:
        synthetic_shape(spec)
    assert str(planner.value) in str(engine.value)
