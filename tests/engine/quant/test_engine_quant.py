"""The engine with quantized weights and KV cache, on synthetic dense and MoE models (fast)."""

from __future__ import annotations

import pytest
import torch

from frota.engine import EngineArgs
from frota.engine import numeric_paths as paths
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model
from frota.engine.quant.apply import QuantEmbedding
from frota.engine.quant.linear import QuantLinear
from tests.engine import teacher_forced as tf

PROMPTS = [[5, 17, 99, 3], list(range(40, 77)), [200, 201] * 9, [42]]
NUM_TOKENS = 12


def assert_forced_within(reference: LLMEngine, other: LLMEngine, fmt: tf.Format) -> None:
    """`other`'s teacher-forced logits of `reference`'s greedy continuations, within `fmt`."""
    forced = tf.greedy(reference, PROMPTS, NUM_TOKENS)
    agreement = tf.compare(tf.teacher_forced_logits(reference, PROMPTS, forced),
                           tf.teacher_forced_logits(other, PROMPTS, forced), forced)
    tf.assert_within_format(agreement, fmt, reference.model_config, f"{paths.describe(other.runner.model)} "
                            f"against {paths.describe(reference.runner.model)}")


def dequantized_twin(spec: str, quantized: torch.nn.Module):  # type: ignore[no-untyped-def]
    """The float model whose weights are exactly what the quantized model holds."""
    model, cfg, tokenizer = load_model(spec, torch.float32, torch.device("cpu"), verbose=False)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, module in quantized.named_modules():
            if isinstance(module, QuantLinear) and ".quant_experts." not in name:
                modules[name].weight.copy_(module.dequantized_weight())
            if hasattr(module, "quant_experts"):
                for e, layer in enumerate(module.quant_experts.quant_w13):
                    modules[name].w13[e].copy_(layer.dequantized_weight())
                for e, layer in enumerate(module.quant_experts.quant_w2):
                    modules[name].w2[e].copy_(layer.dequantized_weight())
    return model, cfg, tokenizer


@pytest.mark.parametrize("preset", ["dense-tiny", "moe-tiny"])
@pytest.mark.parametrize("method", ["int8", "int4", "fp8"])
def test_quantized_engine_computes_its_dequantized_float_twins_logits(preset: str, method: str) -> None:
    # float32 activations on both sides (not `auto`, which is bfloat16 on some CPUs): the
    # weights are the same numbers, so only float32 summation orders differ.
    spec = f"synthetic:{preset},layers=2,seed=3"
    args = dict(dtype="float32", num_kv_blocks=64, block_size=4, verbose=False)
    engine = LLMEngine(EngineArgs(model=spec, quantization=method, **args))
    model = engine.runner.model
    quantized = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert any("qkv_proj" in n for n in quantized) and "lm_head" in quantized
    if preset == "moe-tiny":
        assert any("quant_experts" in n for n in quantized)
    twin = LLMEngine(EngineArgs(model=spec, **args), loaded=dequantized_twin(spec, model))
    assert_forced_within(twin, engine, tf.FLOAT32_ORDER)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_bfloat16_quantized_engine_runs_the_fused_kernels(method: str) -> None:
    spec = "synthetic:dense-tiny,layers=2,seed=3"
    engine = LLMEngine(EngineArgs(model=spec, dtype="bfloat16", quantization=method,
                                  num_kv_blocks=64, block_size=4, verbose=False))
    layer = engine.runner.model.layers[0].self_attn.qkv_proj
    x = torch.zeros(1, layer.in_features, dtype=torch.bfloat16)
    assert layer.kernel_name(x) in (
        "frota_int8", "frota_int4",  # Frota's CPU kernels (cpu_kernels)
        "int8pack_mm", "int4pack_mm_cpu",  # torch's, where the extension cannot be built
    )
    outs = tf.greedy(engine, PROMPTS, NUM_TOKENS)
    assert all(len(o) == NUM_TOKENS for o in outs)


def test_tied_int8_head_serves_the_embedding_from_one_copy() -> None:
    spec = "synthetic:dense-tiny,layers=1,seed=3,tie=1"
    engine = LLMEngine(EngineArgs(model=spec, quantization="int8", num_kv_blocks=16,
                                  block_size=4, verbose=False))
    model = engine.runner.model
    assert model.cfg.tie_word_embeddings
    assert isinstance(model.embed_tokens, QuantEmbedding)
    ids = torch.tensor([1, 2, 3])
    torch.testing.assert_close(model.embed_tokens(ids), model.lm_head.dequantized_weight()[ids])


@pytest.mark.parametrize(("kv_cache_dtype", "fmt"), [("int8", tf.INT8_KV), ("fp8", tf.FP8_KV)])
def test_quantized_kv_cache_keeps_the_logits_within_its_rounding(kv_cache_dtype: str, fmt: tf.Format) -> None:
    spec = "synthetic:dense-tiny,layers=2,seed=3"
    loaded = load_model(spec, torch.float32, torch.device("cpu"), verbose=False)
    args = dict(model=spec, dtype="float32", num_kv_blocks=64, block_size=4, verbose=False)
    assert_forced_within(LLMEngine(EngineArgs(**args), loaded=loaded),
                         LLMEngine(EngineArgs(**args, kv_cache_dtype=kv_cache_dtype), loaded=loaded), fmt)


def test_int8_kv_cache_fits_about_twice_the_blocks_of_bfloat16() -> None:
    # head_dim 64 (SmolLM2's): a float16 scale per 64 int8 values
    spec = "synthetic:dense-tiny,layers=2,head_dim=64,seed=3"
    loaded = load_model(spec, torch.bfloat16, torch.device("cpu"), verbose=False)
    args = dict(model=spec, dtype="bfloat16", kv_cache_memory=1 << 20, verbose=False)
    auto = LLMEngine(EngineArgs(**args), loaded=loaded)
    int8 = LLMEngine(EngineArgs(**args, kv_cache_dtype="int8"), loaded=loaded)
    assert int8.block_manager.num_blocks >= 1.9 * auto.block_manager.num_blocks


def test_engine_args_reject_unknown_quantization() -> None:
    with pytest.raises(ValueError, match="quantization"):
        EngineArgs(quantization="int3")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineArgs(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="parallel"):
        EngineArgs(tensor_parallel_size=2, quantization="int8")


def test_quantized_bfloat16_model_keeps_float32_rotary_tables() -> None:
    """Quantizing casts the rest of the model to bf16 but not its rotary cos/sin caches,
    as the GGUF/HF loaders keep them for a bf16 model (same RoPE numerics as SmolLM2's
    bf16 row, and the engine's fused RoPE + KV-write kernel takes float32 tables)."""
    spec = "synthetic:dense-tiny,layers=1,seed=3"
    engine = LLMEngine(EngineArgs(model=spec, dtype="bfloat16", quantization="int8",
                                  num_kv_blocks=16, block_size=4, verbose=False))
    attn = engine.runner.model.layers[0].self_attn
    assert attn.rotary.cos.dtype == torch.float32 and attn.rotary.sin.dtype == torch.float32
    assert engine.runner.model.norm.weight.dtype == torch.bfloat16
