"""The `InferenceService` object itself and its API coordinates."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from frota.api.contract import API_VERSION, KIND
from frota.api.spec import InferenceServiceSpec
from frota.api.status import InferenceServiceStatus
from frota.api.types import CelRule, FrotaModel

MAX_NAME_LENGTH = 40  # children add suffixes; pod names and label values stay within 63


class ObjectMeta(FrotaModel):
    """The parts of metadata Frota reads; the rest is kept as the apiserver sent it."""

    model_config = ConfigDict(**{**FrotaModel.model_config, "extra": "allow"})

    name: str = Field(
        pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=MAX_NAME_LENGTH,
        description="Name of the InferenceService (a DNS label of at most 40 characters).",
    )
    namespace: str | None = Field(default=None, description="Namespace.")
    uid: str | None = Field(default=None, description="UID, for owner references.")
    generation: int | None = Field(default=None, description="Generation of the spec.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class InferenceService(FrotaModel):
    """A fleet serving one model behind one OpenAI-compatible endpoint."""

    apiVersion: Literal[API_VERSION] = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["InferenceService"] = Field(default=KIND, description="InferenceService")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: InferenceServiceSpec = Field(description="Desired state.")
    status: InferenceServiceStatus | None = Field(default=None, description="Observed state.")

    cel_rules = (
        CelRule(
            f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters (child names add suffixes)",
        ),
    )

    @classmethod
    def from_manifest(cls, obj: dict[str, Any]) -> InferenceService:
        """Validate a manifest dict (as read from YAML or received from the apiserver)."""
        return cls.model_validate(obj)
