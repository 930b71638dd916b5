"""Labels, metadata and owner references shared by every child object."""

from __future__ import annotations

from typing import Any

from frota.api import API_VERSION, KIND, InferenceService
from frota.api.contract import APP_NAME, OPERATOR_MANAGER, Label


def selector_labels(isvc: InferenceService, **extra: str) -> dict[str, str]:
    """The labels that select this InferenceService's pods (stable across revisions)."""
    return {Label.NAME: APP_NAME, Label.INSTANCE: isvc.metadata.name, **extra}


def labels(isvc: InferenceService, role: str | None = None, replica: int | None = None,
           **extra: str) -> dict[str, str]:
    """Labels of a child object (docs/internals.md: name, instance, role, replica)."""
    out = {**selector_labels(isvc), Label.MANAGED_BY: OPERATOR_MANAGER}
    if role is not None:
        out[Label.ROLE] = role
    if replica is not None:
        out[Label.REPLICA] = str(replica)
    return {**out, **extra}


def owner_references(isvc: InferenceService) -> list[dict[str, Any]]:
    """The InferenceService as controller owner; empty when it has no uid yet (`frota render`)."""
    if not isvc.metadata.uid:
        return []
    return [{
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": isvc.metadata.name,
        "uid": isvc.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }]


def metadata(isvc: InferenceService, name: str, object_labels: dict[str, str]) -> dict[str, Any]:
    """metadata of a child: name, namespace (when known), labels, owner references."""
    meta: dict[str, Any] = {"name": name}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    meta["labels"] = object_labels
    owners = owner_references(isvc)
    if owners:
        meta["ownerReferences"] = owners
    return meta
