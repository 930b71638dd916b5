"""Policies around the fleet: disruption budgets, network isolation, autoscaling."""

from __future__ import annotations

from typing import Any

from frota.api import API_VERSION, KIND, InferenceService
from frota.operator.builders.common import (
    ROLE_LABEL,
    WORKER_ROLES,
    labels,
    metadata,
    selector_labels,
)
from frota.operator.topology import Topology

# Scaling metrics as a Prometheus adapter exposes the workers' vLLM-named metrics.
AUTOSCALING_METRICS = {
    "queueDepth": "vllm_num_requests_waiting",
    "ttft": "vllm_time_to_first_token_seconds",
}


def disruption_budget(isvc: InferenceService, role: str) -> dict[str, Any]:
    """At most one pod of a role voluntarily evicted at a time (a rank lost stops its group)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(isvc, f"{isvc.metadata.name}-{role}", labels(isvc, role)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(isvc, **{ROLE_LABEL: role})},
        },
    }


def _worker_pods(isvc: InferenceService) -> dict[str, Any]:
    return {
        "matchLabels": selector_labels(isvc),
        "matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": list(WORKER_ROLES)}],
    }


def network_policy(isvc: InferenceService) -> dict[str, Any]:
    """Workers accept HTTP only from this fleet's router, and anything from their own fleet's ranks."""
    router_pods = {"matchLabels": selector_labels(isvc, **{ROLE_LABEL: "router"})}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(isvc, f"{isvc.metadata.name}-workers", labels(isvc)),
        "spec": {
            "podSelector": _worker_pods(isvc),
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": router_pods}], "ports": [{"port": "http", "protocol": "TCP"}]},
                {"from": [{"podSelector": _worker_pods(isvc)}]},
            ],
        },
    }


def autoscaler(isvc: InferenceService) -> dict[str, Any] | None:
    """A HorizontalPodAutoscaler on the InferenceService's scale subresource, when asked for."""
    scaling = isvc.spec.autoscaling
    if scaling is None:
        return None
    target = scaling.target
    value = f"{int(target * 1000)}m" if scaling.metric == "ttft" or target != int(target) else str(int(target))
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(isvc, isvc.metadata.name, labels(isvc)),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": isvc.metadata.name},
            "minReplicas": scaling.minReplicas,
            "maxReplicas": scaling.maxReplicas,
            "metrics": [{
                "type": "Pods",
                "pods": {
                    "metric": {"name": AUTOSCALING_METRICS[scaling.metric]},
                    "target": {"type": "AverageValue", "averageValue": value},
                },
            }],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": scaling.stabilizationWindowSeconds}},
        },
    }


def policy_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """PodDisruptionBudgets (per worker role and the router), NetworkPolicy, optional HPA."""
    out = [disruption_budget(isvc, role) for role in (*topology.roles, "router")]
    out.append(network_policy(isvc))
    hpa = autoscaler(isvc)
    if hpa is not None:
        out.append(hpa)
    return out
