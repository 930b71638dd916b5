"""The one seam between the reconciler and the API models, planner and builders.

Everything the reconciler knows about what an InferenceService *should* look
like comes through `desired_state(body)`: the validated spec, the revision
hash, the child objects of each replica group (rendered for any group index,
so rollouts can surge) and the shared children (router, config, policies).
When the builders' shapes change, this module is the only one to adjust.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frota.operator.rollout import resolve_bound
from frota.operator.status import (
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_REPLICA,
    LABEL_REVISION,
    LABEL_ROLE,
    Intent,
)

ROUTER_PORT = 8000


class InvalidSpec(ValueError):
    """The spec fails semantic validation; `field` is the path under `spec`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Desired:
    """What one InferenceService should consist of right now."""

    name: str
    namespace: str
    revision: str
    intent: Intent
    max_unavailable: Mapping[str, int]
    max_surge: Mapping[str, int]
    shared: tuple[dict[str, Any], ...]
    render_group: Callable[[str, int], list[dict[str, Any]]] = field(repr=False)

    @property
    def replicas(self) -> dict[str, int]:
        return self.intent.replicas


def validate(body: Mapping[str, Any]) -> Any:
    """Validate the manifest with the API models; raise InvalidSpec naming the first bad field."""
    from frota.operator.validation import SpecError, load

    manifest = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": _plain_metadata(body),
        "spec": dict(body.get("spec") or {}),
    }
    try:
        return load(manifest)
    except SpecError as exc:
        first = exc.errors[0]
        path = first.field.removeprefix("spec.")
        raise InvalidSpec(path, first.message) from None


def _plain_metadata(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    keep = ("name", "namespace", "uid", "generation", "labels", "annotations")
    return {k: meta[k] for k in keep if meta.get(k) is not None}


def revision_of(spec: Mapping[str, Any]) -> str:
    """Hash of everything in the spec that changes a pod (not replica counts or autoscaling).

    Two specs that differ only in scale share a revision, so scaling never
    rolls the fleet.
    """
    pod_shaping = {k: v for k, v in spec.items() if k not in ("replicas", "autoscaling", "rollout")}
    digest = hashlib.sha256(json.dumps(pod_shaping, sort_keys=True).encode()).hexdigest()
    return digest[:10]


def desired_state(body: Mapping[str, Any]) -> Desired:
    """Validate and render. Raises InvalidSpec when the spec is semantically wrong."""
    model = validate(body)
    spec = model.spec
    name = body["metadata"]["name"]
    namespace = body["metadata"].get("namespace") or "default"
    revision = revision_of(body.get("spec") or {})

    if spec.disaggregation is not None:
        per_unit = {
            "prefill": spec.disaggregation.prefill.replicas,
            "decode": spec.disaggregation.decode.replicas,
        }
        ranks = {
            "prefill": (spec.disaggregation.prefill.parallelism or spec.parallelism).world_size,
            "decode": (spec.disaggregation.decode.parallelism or spec.parallelism).world_size,
        }
    else:
        per_unit = {"worker": 1}
        ranks = {"worker": spec.parallelism.world_size}

    max_unavailable = {
        role: resolve_bound(spec.rollout.maxUnavailable, spec.replicas * n, round_up=False,
                            default=0)
        for role, n in per_unit.items()
    }
    max_surge = {
        role: resolve_bound(spec.rollout.maxSurge, spec.replicas * n, round_up=True, default=1)
        for role, n in per_unit.items()
    }
    roles = ",".join(sorted(per_unit))
    selector = (
        f"{LABEL_NAME}=frota,{LABEL_INSTANCE}={name},{LABEL_ROLE} in ({roles})"
    )
    intent = Intent(
        generation=(body.get("metadata") or {}).get("generation"),
        revision=revision,
        units=spec.replicas,
        groups_per_unit=per_unit,
        max_unavailable=max_unavailable,
        selector=selector,
        url=f"http://{name}-router.{namespace}.svc:{ROUTER_PORT}/v1",
        mode=spec.mode,
        capacity=_capacity(model),
    )

    def render_group(role: str, index: int) -> list[dict[str, Any]]:
        children = _fallback_group(name, namespace, role, index, ranks[role], body)
        return [_stamp(c, revision) for c in children]

    return Desired(
        name=name,
        namespace=namespace,
        revision=revision,
        intent=intent,
        max_unavailable=max_unavailable,
        max_surge=max_surge,
        shared=tuple(_fallback_shared(name, namespace, spec.router.replicas, roles)),
        render_group=render_group,
    )


def _capacity(model: Any) -> dict[str, Any]:
    """The planner's per-replica budget, in the status's Capacity shape (empty if unknown)."""
    return {}


def _stamp(obj: dict[str, Any], revision: str) -> dict[str, Any]:
    """Label a group's children with the revision; make StatefulSets restart as a group.

    `OnDelete` keeps the StatefulSet controller from rolling ranks one by one
    (which would mix revisions inside a group); the reconciler deletes all of
    a group's pods at once instead. `Parallel` starts all ranks together.
    """
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).setdefault("labels", {})[LABEL_REVISION] = revision
    if obj.get("kind") == "StatefulSet":
        spec = obj.setdefault("spec", {})
        spec["updateStrategy"] = {"type": "OnDelete"}
        spec["podManagementPolicy"] = "Parallel"
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta.setdefault("labels", {})[LABEL_REVISION] = revision
    return obj


# -- fallback rendering, used until the builders land --------------------------


def _labels(name: str, role: str, replica: int | None = None) -> dict[str, str]:
    labels = {LABEL_NAME: "frota", LABEL_INSTANCE: name, LABEL_ROLE: role}
    if replica is not None:
        labels[LABEL_REPLICA] = str(replica)
    return labels


def _fallback_group(
    name: str, namespace: str, role: str, index: int, ranks: int, body: Mapping[str, Any]
) -> list[dict[str, Any]]:
    group = f"{name}-{role}-{index}"
    labels = _labels(name, role, index)
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": group, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "replicas": ranks,
            "serviceName": group,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "containers": [{
                        "name": "worker",
                        "image": "ghcr.io/frota-dev/frota-worker:0.1.0",
                        "args": ["worker", "--port", "8000"],
                        "env": [{"name": "FROTA_WORLD_SIZE", "value": str(ranks)},
                                {"name": "FROTA_MASTER_ADDR", "value": f"{group}-0.{group}"}],
                    }],
                },
            },
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": group, "namespace": namespace, "labels": dict(labels)},
        "spec": {"clusterIP": "None", "selector": dict(labels),
                 "ports": [{"name": "http", "port": 8000}]},
    }
    return [sts, svc]


def _fallback_shared(name: str, namespace: str, replicas: int, roles: str) -> list[dict[str, Any]]:
    labels = _labels(name, "router")
    router = f"{name}-router"
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": router, "namespace": namespace, "labels": dict(labels)},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {"containers": [{
                        "name": "router",
                        "image": "ghcr.io/frota-dev/frota-worker:0.1.0",
                        "args": ["router", "--port", str(ROUTER_PORT), "--discovery", "kubernetes",
                                 "--selector", f"{LABEL_INSTANCE}={name}"],
                    }]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": router, "namespace": namespace, "labels": dict(labels)},
            "spec": {"selector": dict(labels), "ports": [{"name": "http", "port": ROUTER_PORT}]},
        },
    ]
