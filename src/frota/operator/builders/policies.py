"""Policies around the fleet: disruption budgets and network isolation.

No HorizontalPodAutoscaler: `spec.autoscaling` is carried out by the operator
itself, from the router's metrics, through the scale subresource (no metrics
adapter needed); `frota render` prints only what the operator applies.
A disaggregated role with its own `autoscaling` is read from its workers'
/metrics by the operator, and with LoRA on the operator reads each serving worker's
/v1/models (status.adapters), so the NetworkPolicy then admits the operator's pods to the
workers' HTTP port.
"""

from __future__ import annotations

from typing import Any

from frota.api import InferenceService
from frota.api.contract import APP_NAME, WORKER_ROLES, Label, Role
from frota.operator.builders.common import labels, metadata, selector_labels
from frota.plan.topology import Topology


def disruption_budget(isvc: InferenceService, role: str) -> dict[str, Any]:
    """At most one pod of a role voluntarily evicted at a time (a rank lost stops its group)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, f"{isvc.metadata.name}-{role}", labels(isvc, role)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(isvc, **{Label.ROLE: role})},
        },
    }


def _worker_pods(isvc: InferenceService) -> dict[str, Any]:
    return {
        "matchLabels": selector_labels(isvc),
        "matchExpressions": [{"key": Label.ROLE, "operator": "In", "values": list(WORKER_ROLES)}],
    }


# The operator's pods (manifests/base/deployment.yaml), in whatever namespace it runs.
OPERATOR_POD_LABELS = {Label.NAME: APP_NAME, Label.COMPONENT: "operator"}
# A namespace with this label (its Prometheus) may scrape the workers' /metrics: a
# NetworkPolicy cannot admit one path, so it admits the HTTP port (docs/operations.md).
MONITORING_NAMESPACE_LABEL = "frota.dev/monitoring"


def network_policy(isvc: InferenceService) -> dict[str, Any]:
    """Workers accept HTTP only from this fleet's router, from namespaces labelled
    `frota.dev/monitoring: "true"` (Prometheus), and from the operator when it reads a role's
    metrics to autoscale it or the adapters they list; and anything from their own fleet's
    ranks."""
    router_pods = {"matchLabels": selector_labels(isvc, **{Label.ROLE: Role.ROUTER})}
    http = [{"port": "http", "protocol": "TCP"}]
    monitoring = {"namespaceSelector": {"matchLabels": {MONITORING_NAMESPACE_LABEL: "true"}}}
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": router_pods}], "ports": http},
        {"from": [monitoring], "ports": http},
        {"from": [{"podSelector": _worker_pods(isvc)}]},
    ]
    disagg = isvc.spec.disaggregation
    role_autoscaling = disagg is not None and bool(disagg.prefill.autoscaling or disagg.decode.autoscaling)
    if role_autoscaling or isvc.spec.lora is not None:
        ingress.append({"from": [{"namespaceSelector": {},
                                  "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}],
                        "ports": http})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, f"{isvc.metadata.name}-workers", labels(isvc)),
        "spec": {
            "podSelector": _worker_pods(isvc),
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def policy_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """PodDisruptionBudgets (per worker role and the router) and the NetworkPolicy."""
    return [*(disruption_budget(isvc, role) for role in (*topology.roles, Role.ROUTER)), network_policy(isvc)]
