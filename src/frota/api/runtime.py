"""`spec.runtime`: which engine serves the workers (Frota's own, or vLLM), and what it cannot do.

Everything above the engine (planner, parallel groups, router, autoscaler, status,
`frota up`) is the same for both runtimes. What the vLLM runtime cannot do with a
spec is refused here, by the apiserver (CEL) and by the operator (the same rules in
pydantic), each naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from frota.api.types import CelRule, FrotaModel

RuntimeEngine = Literal["frota", "vllm"]

#: The vLLM version the vllm runtime is built and tested against (the public image's tag).
VLLM_VERSION = "0.32.0"
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"


class Runtime(FrotaModel):
    """The engine that serves each worker rank."""

    engine: RuntimeEngine = Field(
        default="frota",
        description=(
            "frota: Frota's built-in engine (CPU and GPU, every spec field). vllm: vLLM's OpenAI "
            "server, for GPU fleets that want vLLM; the fields it cannot serve are refused."
        ),
    )
    image: str | None = Field(
        default=None, min_length=1,
        description=f"Worker image; default: spec.engine.image for frota, {VLLM_IMAGE} for vllm.",
    )
    args: list[str] = Field(
        default_factory=list, max_length=64,
        description="Extra flags of the runtime's server, passed last (after every flag Frota sets).",
    )


def _vllm(rule: str) -> str:
    return f"self.runtime.engine != 'vllm' || ({rule})"


#: What the vllm runtime refuses, as (CEL rule over the spec, message, field path); the
#: spec's pydantic validator checks the same conditions (`vllm_problems`).
VLLM_RULES = (
    CelRule(
        _vllm("!has(self.disaggregation)"),
        "runtime.engine vllm serves colocated replicas only: prefill/decode disaggregation "
        "moves KV blocks with Frota's KV transfer",
        ".disaggregation",
    ),
    CelRule(
        _vllm("self.engine.quantization.weights == 'none' || self.engine.quantization.weights == 'fp8'"),
        "runtime.engine vllm quantizes an unquantized checkpoint to fp8 only: int8 and int4 "
        "weights need runtime.engine frota",
        ".engine.quantization.weights",
    ),
    CelRule(
        _vllm("self.engine.quantization.kvCache != 'int8'"),
        "runtime.engine vllm has no int8 KV cache: use auto or fp8",
        ".engine.quantization.kvCache",
    ),
    CelRule(
        _vllm("!self.model.uri.startsWith('synthetic:')"),
        "runtime.engine vllm loads checkpoints only: synthetic models need runtime.engine frota",
        ".model.uri",
    ),
    CelRule(
        _vllm("self.parallelism.expert == 1 || self.parallelism.expert == self.parallelism.tensor"),
        "runtime.engine vllm splits the experts over all tensor-parallel ranks: "
        "parallelism.expert must be 1 or equal parallelism.tensor",
        ".parallelism.expert",
    ),
    CelRule(
        _vllm("has(self.resources.accelerator) || self.engine.kvCache.blockSize == 32"),
        "runtime.engine vllm on CPU pages the KV cache in blocks of 32 tokens: set "
        "engine.kvCache.blockSize to 32, or give the ranks an accelerator",
        ".engine.kvCache.blockSize",
    ),
    CelRule(
        _vllm("!has(self.engine.extraArgs) || size(self.engine.extraArgs) == 0"),
        "engine.extraArgs are `frota worker` flags: give vLLM's flags in runtime.args",
        ".engine.extraArgs",
    ),
)
