"""`InferenceServiceStatus`: what the operator observed and planned."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from frota.api.contract import ConditionType, WorkerRole
from frota.api.types import FrotaModel


class Condition(FrotaModel):
    """One aspect of the InferenceService's state (metav1.Condition)."""

    type: ConditionType = Field(
        description=(
            "Ready: every replica of the current revision serves and the router has them; "
            "Progressing: a rollout or scale is under way; Degraded: fewer replicas serve than wanted; "
            "SpecValid: the spec passed semantic validation."
        )
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024,
        description="CamelCase reason for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    observedGeneration: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )
    lastTransitionTime: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"},
        description="When the status last changed (RFC 3339).",
    )


class RoleStatus(FrotaModel):
    """Replica groups of one role."""

    role: WorkerRole = Field(description="The role.")
    replicas: int = Field(default=0, ge=0, description="Replica groups that exist.")
    readyReplicas: int = Field(default=0, ge=0, description="Replica groups whose every rank is ready.")
    updatedReplicas: int = Field(default=0, ge=0, description="Replica groups at the current revision.")


class Capacity(FrotaModel):
    """What one replica can hold (the decode role when disaggregated): planned, and reported."""

    weightBytesPerRank: int | None = Field(default=None, ge=0, description="Weight memory of the largest rank.")
    kvCacheTokensPerReplica: int | None = Field(
        default=None, ge=0, description="Tokens of KV cache one replica holds, as planned."
    )
    maxModelLen: int | None = Field(default=None, ge=0, description="Longest sequence in tokens.")
    sequencesAtMaxModelLen: int | None = Field(
        default=None, ge=0, description="Sequences of maxModelLen tokens that fit one replica's KV cache."
    )
    reportedKvCacheTokensPerReplica: int | None = Field(
        default=None, ge=0,
        description=(
            "Tokens of KV cache the serving replicas' engines report (vllm:cache_config_info: "
            "num_gpu_blocks x block_size); the smallest replica's. Unset while no replica serves."
        ),
    )


class AdapterStatus(FrotaModel):
    """One LoRA adapter: from the spec, or loaded at run time, and where it is loaded."""

    name: str = Field(min_length=1, max_length=63, description="The adapter's served name.")
    source: Literal["spec", "runtime"] = Field(
        description="spec: listed in spec.adapters; runtime: loaded through /v1/load_lora_adapter."
    )
    path: str | None = Field(
        default=None, description="Where the workers read it (a runtime-loaded adapter's lora_path)."
    )
    residentReplicas: int = Field(
        default=0, ge=0, description="Serving replicas that have the adapter loaded (listed in /v1/models)."
    )
    lastError: str | None = Field(
        default=None, max_length=1024,
        description="Why the adapter is missing from a serving replica that answered; unset when none is.",
    )


class ModelCacheStatus(FrotaModel):
    """spec.model.cache's Job: whether the weights are in the claim."""

    state: Literal["Pending", "Downloading", "Ready", "Failed"] = Field(
        description="Pending: the Job has not started; Downloading: it runs; Ready: the marker is written; Failed: the Job gave up, or a worker pod's check found the cache's files changed since they were recorded."
    )
    bytes: int | None = Field(
        default=None, ge=0,
        description="Bytes downloaded so far while Downloading (as the fill pod last reported); bytes in the cache once Ready.",
    )
    totalBytes: int | None = Field(
        default=None, ge=0, description="Bytes the source announced (Content-Length), where known."
    )
    percent: int | None = Field(
        default=None, ge=0, le=100, description="bytes of totalBytes while Downloading (where the total is known); 100 once Ready."
    )
    progress: str | None = Field(
        default=None, max_length=64,
        description="The state with its progress, as `kubectl get -o wide` shows it: Downloading 41% (12.0 MiB), Ready (1.2 GiB).",
    )
    reason: str | None = Field(default=None, max_length=1024, description="Why the Job failed, or which file a worker pod's check found changed (with both digests).")
    job: str | None = Field(default=None, max_length=253, description="The Job that fills the cache.")

    @model_validator(mode="after")
    def _progress(self) -> ModelCacheStatus:
        # Derived from the fields above, for the printer column (which cannot format numbers).
        text = self.state
        if self.state == "Downloading" and self.percent is not None:
            text += f" {self.percent}%"
        if self.state in ("Downloading", "Ready") and self.bytes is not None:
            text += f" ({_size(self.bytes)})"
        object.__setattr__(self, "progress", text)
        return self


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


class InferenceServiceStatus(FrotaModel):
    """Observed state of an InferenceService."""

    observedGeneration: int | None = Field(default=None, ge=0, description="Last metadata.generation acted on.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing, Degraded and SpecValid.",
    )
    replicas: int = Field(
        default=0, ge=0, description="Replicas (units when disaggregated) that exist; the scale subresource's status."
    )
    readyReplicas: int = Field(default=0, ge=0, description="Replicas (units) whose every group serves.")
    readyOfReplicas: str | None = Field(
        default=None, max_length=32,
        description="readyReplicas/replicas, as the Replicas column of `kubectl get` shows it (0/0 at zero).",
    )
    roles: list[RoleStatus] = Field(
        default_factory=list, max_length=3,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["role"]},
        description="Replica groups per role.",
    )
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (for the scale subresource and HPAs)."
    )
    url: str | None = Field(default=None, description="OpenAI-compatible base URL of the router.")
    mode: Literal["Colocated", "Disaggregated"] | None = Field(default=None, description="Serving mode.")
    revision: str | None = Field(default=None, description="Revision of the pod spec the Ready replicas run.")
    capacity: Capacity | None = Field(
        default=None, description="Memory budget per replica: planned, and as the engines report it."
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None, max_length=256,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=(
            "Each LoRA adapter, from the spec or loaded at run time, and how many serving "
            "replicas have it (read from the workers' /v1/models); unset while LoRA is off."
        ),
    )
    modelCache: ModelCacheStatus | None = Field(
        default=None, description="The shared model cache's Job (spec.model.cache); unset while the cache is off."
    )

    @model_validator(mode="after")
    def _ready_of_replicas(self) -> InferenceServiceStatus:
        # Derived, never set apart from the counts: a printer column cannot join two fields.
        object.__setattr__(self, "readyOfReplicas", f"{self.readyReplicas}/{self.replicas}")
        return self
