"""The fleet's shape: parallelism, resources, disaggregation, router, scaling, rollout, placement."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from frota.api.contract import AdmissionDefault
from frota.api.engine import SecretKeyRef
from frota.api.types import CelRule, FrotaModel, IntOrPercent, Quantity, nested_default


class Parallelism(FrotaModel):
    """How one replica is sharded over ranks (one pod per rank; ranks = tensor x pipeline)."""

    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size: ranks that split each layer.")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size: stages that split the layers.")
    expert: int = Field(
        default=1, ge=1, le=64,
        description=(
            "Expert-parallel size for mixture-of-experts models: the tensor-parallel ranks of a "
            "stage split the experts into this many groups (must divide tensor)."
        ),
    )

    cel_rules = (
        CelRule(
            "self.tensor % self.expert == 0",
            "expert must divide tensor: expert-parallel groups are made of the tensor-parallel ranks",
            ".expert",
        ),
    )

    @model_validator(mode="after")
    def _expert_divides_tensor(self) -> Parallelism:
        if self.tensor % self.expert:
            raise ValueError(self.cel_rules[0].message)
        return self

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline


class Accelerator(FrotaModel):
    """Accelerators requested by every rank."""

    resourceName: str = Field(
        default="nvidia.com/gpu", min_length=1,
        description="Extended resource name of the accelerator (nvidia.com/gpu, amd.com/gpu, ...).",
    )
    count: int = Field(default=1, ge=1, le=16, description="Accelerators per rank.")
    memory: Quantity | None = Field(
        default=None,
        description="Memory of one accelerator (e.g. 80Gi); used to plan the KV cache and report capacity.",
    )


class Resources(FrotaModel):
    """Compute requested by every rank."""

    accelerator: Accelerator | None = Field(
        default=None, description="Accelerators per rank; leave unset to run on CPU."
    )
    cpu: Quantity = Field(default="1", description="CPU request per rank.")
    memory: Quantity = Field(
        default="2Gi",
        description="Memory request (and limit) per rank; on CPU it also bounds the weights plus KV cache.",
    )


class ScaleToZero(FrotaModel):
    """With autoscaling.minReplicas 0: no replica while idle; the router stays up and holds
    requests while one starts."""

    idleSeconds: int = Field(
        default=300, ge=10, le=86400,
        description="Seconds without a request after which the fleet scales to zero replicas.",
    )
    holdSeconds: int = Field(
        default=120, ge=1, le=3600,
        description=(
            "Seconds the router holds a request while no replica is ready (at zero, and while "
            "one starts); past it the answer is 503 with Retry-After."
        ),
    )
    maxHeldRequests: int = Field(
        default=1024, ge=1, le=100000,
        description="Requests the router holds at once; beyond it, 503 with Retry-After at once.",
    )


class ScalingPolicy(FrotaModel):
    """What every scaler has: its bounds, its metric and target, and how fast it comes down."""

    minReplicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas (units when disaggregated).")
    maxReplicas: int = Field(ge=1, le=1000, description="Most replicas (units when disaggregated).")
    metric: Literal["queueDepth", "ttft"] = Field(
        default="queueDepth",
        description="queueDepth: waiting requests per replica; ttft: time to first token in seconds.",
    )
    target: float = Field(ge=0.001, le=1000000, description="Target value of the metric per replica.")
    stabilizationWindowSeconds: int = Field(
        default=300, ge=0, le=3600, description="How long a lower recommendation must hold before scaling down."
    )

    cel_rules = (
        CelRule("self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas", ".minReplicas"),
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> ScalingPolicy:
        if self.minReplicas > self.maxReplicas:
            raise ValueError(ScalingPolicy.cel_rules[0].message)
        return self


class Autoscaling(ScalingPolicy):
    """Scale spec.replicas on a serving metric read from the router (the operator does it, HPA-style)."""

    minReplicas: int = Field(
        default=1, ge=0, le=1000,
        description="Fewest replicas (units when disaggregated); 0 scales to zero when idle (see scaleToZero).",
    )
    scaleToZero: ScaleToZero | None = Field(
        default=None,
        description="Idle and hold times of scaling to zero (minReplicas 0 only; its defaults when unset).",
    )

    cel_rules = (
        *ScalingPolicy.cel_rules,
        CelRule("!has(self.scaleToZero) || self.minReplicas == 0",
                "scaleToZero applies only with minReplicas: 0", ".scaleToZero"),
    )

    @model_validator(mode="after")
    def _zero_only(self) -> Autoscaling:
        if self.scaleToZero is not None and self.minReplicas != 0:
            raise ValueError(self.cel_rules[1].message)
        return self

    def scale_to_zero(self) -> ScaleToZero | None:
        """The scale-to-zero settings in effect: None unless minReplicas is 0."""
        if self.minReplicas != 0:
            return None
        return self.scaleToZero or ScaleToZero()


class RoleAutoscaling(ScalingPolicy):
    """Scale one disaggregated role's groups per unit on that role's own workers' metrics."""

    minReplicas: int = Field(default=1, ge=1, le=64, description="Fewest groups of this role per unit.")
    maxReplicas: int = Field(ge=1, le=64, description="Most groups of this role per unit.")
    metric: Literal["queueDepth", "ttft"] = Field(
        default="queueDepth",
        description=(
            "queueDepth: requests waiting plus running per group of this role; ttft: this role's "
            "mean time to first token in seconds (both read from the role's rank-0 workers)."
        ),
    )
    target: float = Field(ge=0.001, le=1000000, description="Target value of the metric per group.")


class RoleSpec(FrotaModel):
    """One side of a disaggregated unit (prefill or decode)."""

    replicas: int = Field(default=1, ge=1, le=64, description="Replica groups of this role in each unit.")
    parallelism: Parallelism | None = Field(
        default=None, description="Sharding of this role; default: spec.parallelism."
    )
    resources: Resources | None = Field(default=None, description="Resources per rank; default: spec.resources.")
    autoscaling: RoleAutoscaling | None = Field(
        default=None,
        description=(
            "Scale this role's replicas (groups per unit) on its own workers' metrics, "
            "independently of the other role; unset: fixed."
        ),
    )

    cel_rules = (
        CelRule(
            "!has(self.parallelism) || self.parallelism.pipeline == 1",
            "disaggregated roles do not support pipeline parallelism (KV blocks move rank to rank)",
            ".parallelism.pipeline",
        ),
    )

    @model_validator(mode="after")
    def _no_pipeline(self) -> RoleSpec:
        if self.parallelism is not None and self.parallelism.pipeline != 1:
            raise ValueError(self.cel_rules[0].message)
        return self


class Disaggregation(FrotaModel):
    """Split prefill and decode into separate groups that scale as one unit."""

    prefill: RoleSpec = Field(
        default_factory=RoleSpec, json_schema_extra=nested_default(RoleSpec),
        description="Prefill groups per unit: compute the prompt's KV cache and the first token.",
    )
    decode: RoleSpec = Field(
        default_factory=RoleSpec, json_schema_extra=nested_default(RoleSpec),
        description="Decode groups per unit: pull the KV blocks and generate the rest.",
    )
    minPromptTokens: int = Field(
        default=256, ge=0, le=1048576,
        description="Shorter prompts stay on a decode group (moving their KV costs more than it saves).",
    )


class Admission(FrotaModel):
    """Router-side admission control."""

    maxInflight: int = Field(default=AdmissionDefault.FLEET_MAX_INFLIGHT, ge=1, le=1000000, description="Most requests in flight per router replica.")
    maxQueue: int = Field(
        default=AdmissionDefault.MAX_QUEUE, ge=0, le=1000000,
        description="Most requests waiting for a worker per router replica before it answers 429.",
    )


class Router(FrotaModel):
    """The OpenAI-compatible endpoint in front of the workers."""

    replicas: int = Field(default=1, ge=1, le=64, description="Router pods.")
    policy: Literal["round-robin", "least-load", "prefix-aware", "session"] = Field(
        default="least-load", description="How a request picks a replica."
    )
    admission: Admission = Field(
        default_factory=Admission, json_schema_extra=nested_default(Admission), description="Admission limits."
    )
    apiKeySecret: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the API key clients must send as a Bearer token."
    )
    serviceType: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Type of the router's Service."
    )
    cpu: Quantity = Field(default="500m", description="CPU request per router pod.")
    memory: Quantity = Field(default="512Mi", description="Memory request and limit per router pod.")


class Rollout(FrotaModel):
    """How a new revision replaces the old one, group by group (a group never mixes revisions)."""

    maxUnavailable: IntOrPercent = Field(default=0, description="Replicas that may be down during a rollout.")
    maxSurge: IntOrPercent = Field(default=1, description="Extra replicas that may be started during a rollout.")

    cel_rules = (
        CelRule(
            "!(string(self.maxUnavailable) in ['0', '0%'] && string(self.maxSurge) in ['0', '0%'])",
            "maxUnavailable and maxSurge cannot both be zero",
        ),
        CelRule(
            "(type(self.maxUnavailable) != int || self.maxUnavailable >= 0)"
            " && (type(self.maxSurge) != int || self.maxSurge >= 0)",
            "maxUnavailable and maxSurge must be non-negative counts or percentages",
        ),
    )

    @model_validator(mode="after")
    def _can_progress(self) -> Rollout:
        if str(self.maxUnavailable) in ("0", "0%") and str(self.maxSurge) in ("0", "0%"):
            raise ValueError(self.cel_rules[0].message)
        return self


class Toleration(FrotaModel):
    """A Kubernetes toleration."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists tolerates everything.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="How the value is matched.")
    value: str | None = Field(default=None, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty tolerates all effects."
    )
    tolerationSeconds: int | None = Field(default=None, ge=0, description="For NoExecute: how long to stay.")


class Placement(FrotaModel):
    """Where worker pods are scheduled."""

    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Node labels worker pods require.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of worker pods."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="A core/v1 Affinity for worker pods, passed through unchanged.",
    )
    priorityClassName: str | None = Field(default=None, description="PriorityClass of worker pods.")
