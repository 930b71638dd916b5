"""Labels, metadata, owner references and security settings shared by every child object."""

from __future__ import annotations

from typing import Any

from frota.api import API_VERSION, KIND, InferenceService
from frota.api.contract import APP_NAME, OPERATOR_MANAGER, Label

RUN_AS_USER = 10001
# SIGTERM to SIGKILL, for workers and routers alike: each drains its requests in flight
# for all but the last DRAIN_MARGIN_SECONDS (and the router's preStop wait) of it.
TERMINATION_GRACE_SECONDS = 60
DRAIN_MARGIN_SECONDS = 10


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


def pod_security_context() -> dict[str, Any]:
    """Non-root, RuntimeDefault seccomp, volumes writable by the run-as group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """No privilege escalation, no capabilities, read-only root (writes go to /tmp)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def http_probe(path: str, *, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    """An HTTP GET probe on the container's `http` port."""
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def tmp_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """An emptyDir for /tmp (the root filesystem is read-only)."""
    return {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, {"name": "tmp", "mountPath": "/tmp"}


# HOME and caches point into /tmp so libraries that write there work on a read-only root.
WRITABLE_HOME_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
]
