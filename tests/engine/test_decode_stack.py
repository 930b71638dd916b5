"""The fused decode stack (kernels/decode_stack.cpp): bit for bit the Python layers, with and
without rows under LoRA adapters, and only where it applies."""

from __future__ import annotations

import sys

import pytest
import torch

from frota.engine import EngineArgs, SamplingParams, kernels
from frota.engine import numeric_paths as paths
from frota.engine.llm_engine import LLMEngine
from frota.engine.model import decode_stack
from frota.engine.quant import cpu_kernels

pytestmark = pytest.mark.skipif(kernels.cpu_kernels() is None or cpu_kernels.kernels() is None,
                                reason="Frota's C++ kernels cannot be built here")

SPEC = "synthetic:dense-tiny,layers=3,seed=5"
PROMPTS = [list(range(7, 47)), [3, 9, 27, 81, 243], [300] * 11]
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3)


class CountingStack(decode_stack.DecodeStack):
    """Counts the steps the stack ran, and those with rows under adapters."""

    def __init__(self, stack: decode_stack.DecodeStack) -> None:
        super().__init__(stack.stack, stack.max_rows)
        self.runs = self.adapter_runs = 0

    def run(self, x, positions, meta, lora=None):  # type: ignore[no-untyped-def]
        self.runs += 1
        self.adapter_runs += lora is not None
        return super().run(x, positions, meta, lora)


def engine(dtype: str, quantization: str = "int4", spec: str = SPEC, **kwargs) -> LLMEngine:  # type: ignore[no-untyped-def]
    return LLMEngine(EngineArgs(model=spec, dtype=dtype, quantization=quantization, num_kv_blocks=64,
                                block_size=4, enable_prefix_caching=False, verbose=False, **kwargs))


def counting(e: LLMEngine) -> CountingStack:
    """The engine's stack, counting from now on."""
    model, caches = e.runner.model, e.runner.kv_caches
    stack = decode_stack.build(model, caches, model.embed_tokens.weight.dtype)
    assert stack is not None
    model._decode_stack = (caches, CountingStack(stack))
    return model._decode_stack[1]


def generate(e: LLMEngine, fused: bool, prompts: list[list[int]],
             adapters: list[str | None] | None = None) -> dict[str, list]:
    e.runner.model.fused_decode = fused
    outs: dict[str, list] = {}
    for i, prompt in enumerate(prompts):
        e.add_request(f"{fused}-{i}", prompt, PARAMS, adapter=adapters[i] if adapters else None)
    while e.has_unfinished:
        for out in e.step():
            _, i = out.request_id.split("-")
            outs.setdefault(i, []).append((out.new_token_ids, out.new_logprobs))
    return outs


@pytest.mark.parametrize(("dtype", "quantization"), [
    ("float32", "int4"), ("bfloat16", "int4"), ("float32", "none"), ("bfloat16", "none"),
])
def test_fused_decode_gives_the_python_layers_output_bit_for_bit(dtype: str, quantization: str) -> None:
    e = engine(dtype, quantization)
    model, caches = e.runner.model, e.runner.kv_caches
    stack = decode_stack.build(model, caches, model.embed_tokens.weight.dtype)
    assert stack is not None and len(stack) == 3
    # int4 takes the rows of Frota's int4 kernel; float weights, any decode step.
    assert stack.max_rows == (8 if quantization == "int4" else sys.maxsize)
    # Float weights: a batch past the int4 kernel's 8 rows goes through the stack too.
    prompts = PROMPTS if quantization == "int4" else PROMPTS + [[50 + i] * (3 + i) for i in range(9)]
    counting = CountingStack(stack)
    model._decode_stack = (caches, counting)
    fused = generate(e, True, prompts)
    assert counting.runs >= PARAMS.max_tokens - 1  # every decode step of the batch went through it
    python = generate(e, False, prompts)
    assert counting.runs < 2 * PARAMS.max_tokens
    assert fused == python, f"paths: {paths.describe(model)}"  # token ids and every logprob, exactly


@pytest.mark.parametrize(("dtype", "quantization"), [
    ("float32", "int4"), ("float32", "none"), ("bfloat16", "none"),
])
def test_adapter_rows_go_through_the_stack_bit_for_bit(tmp_path, dtype: str, quantization: str) -> None:
    from tests.engine.lora import synthetic

    e = engine(dtype, quantization, spec=synthetic.SPEC, max_loras=2, max_lora_rank=8)
    for name, path in synthetic.make_adapters(tmp_path, synthetic.load()[1], count=2).items():
        e.load_adapter(name, str(path))
    stack = counting(e)
    prompts, adapters = [*PROMPTS, [11] * 6], ["a0", None, "a1", "a0"]
    fused = generate(e, True, prompts, adapters)
    assert stack.adapter_runs >= PARAMS.max_tokens - 1  # the decode steps with adapter rows
    python = generate(e, False, prompts, adapters)
    assert stack.adapter_runs < 2 * PARAMS.max_tokens
    assert fused == python, f"paths: {paths.describe(e.runner.model)}"
    base = generate(e, True, prompts[:1])
    assert base["0"] != fused["0"]  # the adapter changed the output: its delta was added


def test_the_stack_declines_weights_it_has_no_kernel_for() -> None:
    e = engine("bfloat16", "int8")
    assert decode_stack.build(e.runner.model, e.runner.kv_caches, torch.bfloat16) is None


def test_the_stack_declines_a_quantized_kv_pool_and_moe() -> None:
    e = engine("bfloat16", kv_cache_dtype="int8")
    assert decode_stack.build(e.runner.model, e.runner.kv_caches, torch.bfloat16) is None
    moe = LLMEngine(EngineArgs(model="synthetic:moe-tiny,layers=2,seed=3", dtype="bfloat16",
                               quantization="int4", num_kv_blocks=64, block_size=4, verbose=False))
    assert decode_stack.build(moe.runner.model, moe.runner.kv_caches, torch.bfloat16) is None


def test_only_decode_only_steps_the_kernels_take_go_through_the_stack() -> None:
    from frota.engine.attention import AttentionMetadata, PrefillSpan

    def meta(decodes: int, prefill: int = 0) -> AttentionMetadata:
        slots = torch.zeros(decodes + prefill, dtype=torch.long)
        spans = [PrefillSpan(decodes, prefill, prefill, None)] if prefill else []
        return AttentionMetadata(slots, slots, num_decodes=decodes, prefills=spans)

    stack = decode_stack.DecodeStack(None, max_rows=8)
    x = torch.zeros(64, 16)
    assert stack.applies(x[:1], meta(1)) and stack.applies(x[:8], meta(8))
    assert not stack.applies(x[:9], meta(9)) and not stack.applies(x, meta(64))  # past 8 rows
    assert not stack.applies(x[:5], meta(1, 4))  # a step with a prefill chunk
    assert decode_stack.DecodeStack(None, max_rows=64).applies(x, meta(64))
