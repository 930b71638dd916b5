"""`InferenceServiceSpec`: the whole desired state a user writes."""

from __future__ import annotations

from pydantic import Field, model_validator

from frota.api.adapters import MAX_ADAPTERS_LISTED, Adapter, LoRA
from frota.api.contract import ModelScheme
from frota.api.engine import Engine, ModelSource
from frota.api.fleet import (
    Autoscaling,
    Disaggregation,
    Parallelism,
    Placement,
    Resources,
    Rollout,
    Router,
)
from frota.api.runtime import VLLM_IMAGE, VLLM_RULES, Runtime
from frota.api.types import CelRule, FrotaModel, nested_default

_TENSOR = "(has(self.disaggregation.{role}.parallelism) ? self.disaggregation.{role}.parallelism.tensor : self.parallelism.tensor)"


class InferenceServiceSpec(FrotaModel):
    """Desired state of an InferenceService: one model served by a fleet of sharded replicas."""

    model: ModelSource = Field(description="The model to serve.")
    engine: Engine = Field(
        default_factory=Engine, json_schema_extra=nested_default(Engine), description="Engine settings shared by all ranks."
    )
    runtime: Runtime = Field(
        default_factory=Runtime, json_schema_extra=nested_default(Runtime),
        description="The engine that serves the workers: frota (built in) or vllm.",
    )
    parallelism: Parallelism = Field(
        default_factory=Parallelism, json_schema_extra=nested_default(Parallelism),
        description="Sharding of each replica (of each role, unless the role overrides it).",
    )
    resources: Resources = Field(
        default_factory=Resources, json_schema_extra=nested_default(Resources),
        description="Resources of each rank (of each role, unless the role overrides it).",
    )
    replicas: int = Field(
        default=1, ge=0, le=1000,
        description=(
            "Replicas: colocated replica groups, or, with disaggregation, units of "
            "prefill.replicas prefill groups plus decode.replicas decode groups. "
            "The scale subresource (kubectl scale, HorizontalPodAutoscaler) sets this field."
        ),
    )
    disaggregation: Disaggregation | None = Field(
        default=None, description="Serve prefill and decode from separate groups; unset: colocated."
    )
    router: Router = Field(
        default_factory=Router, json_schema_extra=nested_default(Router), description="The router in front of the workers."
    )
    autoscaling: Autoscaling | None = Field(default=None, description="Scale replicas on a serving metric.")
    rollout: Rollout = Field(
        default_factory=Rollout, json_schema_extra=nested_default(Rollout), description="Rolling update limits."
    )
    placement: Placement = Field(
        default_factory=Placement, json_schema_extra=nested_default(Placement), description="Scheduling of worker pods."
    )
    adapters: list[Adapter] = Field(
        default_factory=list, max_length=MAX_ADAPTERS_LISTED,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=(
            "LoRA adapters every worker loads at start; a request's `model` names one. "
            "Listing any turns LoRA on (spec.engine.lora's defaults unless set)."
        ),
    )

    cel_rules = (
        CelRule(
            "!(self.engine.quantization.weights == 'fp8' || self.engine.quantization.kvCache == 'fp8')"
            " || has(self.resources.accelerator)",
            "fp8 quantization needs an accelerator: set spec.resources.accelerator or use int8",
            ".engine.quantization",
        ),
        CelRule(
            "!has(self.disaggregation) || "
            + _TENSOR.format(role="prefill") + " == " + _TENSOR.format(role="decode"),
            "prefill and decode must use the same tensor-parallel size (KV blocks move rank to rank)",
            ".disaggregation",
        ),
        CelRule(
            "!has(self.adapters) || self.adapters.all(a, a.name != self.model.name)",
            "an adapter's name must differ from spec.model.name (a request's model picks one or the other)",
            ".adapters",
        ),
        CelRule(
            "!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
            "adapter names must be unique",
            ".adapters",
        ),
        *VLLM_RULES,
    )

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceServiceSpec:
        quant = self.engine.quantization
        if "fp8" in (quant.weights, quant.kvCache) and self.resources.accelerator is None:
            raise ValueError(self.cel_rules[0].message)
        if self.disaggregation is not None:
            prefill = self.disaggregation.prefill.parallelism or self.parallelism
            decode = self.disaggregation.decode.parallelism or self.parallelism
            if prefill.tensor != decode.tensor:
                raise ValueError(self.cel_rules[1].message)
        names = [a.name for a in self.adapters]
        if self.model.name in names:
            raise ValueError(self.cel_rules[2].message)
        if len(set(names)) != len(names):
            raise ValueError(self.cel_rules[3].message)
        if problems := self.vllm_problems():
            raise ValueError(problems[0].message)
        return self

    def vllm_problems(self) -> list[CelRule]:
        """The `VLLM_RULES` this spec breaks (none unless runtime.engine is vllm)."""
        if self.runtime.engine != "vllm":
            return []
        quant, par = self.engine.quantization, self.parallelism
        broken = (
            self.disaggregation is not None,
            quant.weights not in ("none", "fp8"),
            quant.kvCache == "int8",
            self.model.uri.startswith(ModelScheme.SYNTHETIC),
            par.expert not in (1, par.tensor),
            self.resources.accelerator is None and self.engine.kvCache.blockSize != 32,
            bool(self.engine.extraArgs),
        )
        return [rule for rule, bad in zip(VLLM_RULES, broken, strict=True) if bad]

    @property
    def lora(self) -> LoRA | None:
        """The adapter slots in effect: spec.engine.lora, else the defaults when adapters are
        listed; None: LoRA off."""
        if self.engine.lora is not None:
            return self.engine.lora
        return LoRA() if self.adapters else None

    @property
    def worker_image(self) -> str:
        """The image of the worker containers: runtime.image, else the runtime's default."""
        if self.runtime.image:
            return self.runtime.image
        return VLLM_IMAGE if self.runtime.engine == "vllm" else self.engine.image

    @property
    def mode(self) -> str:
        return "Disaggregated" if self.disaggregation is not None else "Colocated"
