"""Router children: Deployment, Service, and the ServiceAccount/Role that let it watch EndpointSlices."""

from __future__ import annotations

from typing import Any

from frota.api import InferenceService
from frota.api.contract import Label
from frota.operator.builders.common import (
    DRAIN_MARGIN_SECONDS,
    TERMINATION_GRACE_SECONDS,
    WRITABLE_HOME_ENV,
    container_security_context,
    http_probe,
    labels,
    metadata,
    pod_security_context,
    selector_labels,
    tmp_volume,
)
from frota.plan.topology import Topology

ROUTER_PORT = 8000
SERVICE_PORT = 80
API_KEY_DIR = "/var/run/secrets/frota/api-key"
ROUTER_ENDPOINT_DRAIN_SECONDS = 5  # preStop: out of the Service's endpoints before SIGTERM
# After SIGTERM: requests in flight finish (a long generation included) before the
# router stops. With the preStop wait it ends when a worker's drain ends (the pod's grace
# less the margin), so the router never cuts off an answer a worker would have finished.
ROUTER_DRAIN_SECONDS = TERMINATION_GRACE_SECONDS - ROUTER_ENDPOINT_DRAIN_SECONDS - DRAIN_MARGIN_SECONDS


def router_name(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-router"


def router_service_name(isvc: InferenceService) -> str:
    """The router's Service carries the InferenceService's own name: http://NAME.NS.svc/v1."""
    return isvc.metadata.name


def discovery_selector(isvc: InferenceService) -> str:
    """Label selector of the EndpointSlices of the rank-0 Services (one per role)."""
    return f"{Label.INSTANCE}={isvc.metadata.name},{Label.SERVING}=true"


def service_url(isvc: InferenceService) -> str:
    """The OpenAI base URL clients use inside the cluster."""
    namespace = isvc.metadata.namespace or "default"
    return f"http://{router_service_name(isvc)}.{namespace}.svc:{SERVICE_PORT}/v1"


def router_args(isvc: InferenceService, topology: Topology) -> list[str]:
    return [
        "router", "--discovery", "kubernetes",
        "--namespace", "$(POD_NAMESPACE)",
        "--selector", discovery_selector(isvc),
        "--port-name", "http",
        "--port", str(ROUTER_PORT),
        "--policy", topology.router.policy,
        "--drain-timeout", str(ROUTER_DRAIN_SECONDS),
    ]


def service_account(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(isvc, router_name(isvc), labels(isvc, "router")),
        "automountServiceAccountToken": True,
    }


def role(isvc: InferenceService) -> dict[str, Any]:
    """Read-only access to EndpointSlices in the namespace, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(isvc, router_name(isvc), labels(isvc, "router")),
        "rules": [{
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }],
    }


def role_binding(isvc: InferenceService) -> dict[str, Any]:
    meta = metadata(isvc, router_name(isvc), labels(isvc, "router"))
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": router_name(isvc)}
    if isvc.metadata.namespace:
        subject["namespace"] = isvc.metadata.namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router_name(isvc)},
        "subjects": [subject],
    }


def deployment(isvc: InferenceService, topology: Topology) -> dict[str, Any]:
    """The router pods: stateless, rolled one at a time with no capacity loss."""
    router = isvc.spec.router
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    env += [{"name": k, "value": v} for k, v in topology.router.env.items()]
    env += WRITABLE_HOME_ENV
    tmp, tmp_mount = tmp_volume()
    volumes, mounts = [tmp], [tmp_mount]
    if router.apiKeySecret is not None:
        # A file, not an env var: the key stays out of `kubectl describe` and process listings.
        secret = router.apiKeySecret
        volumes.append({"name": "api-key", "secret": {
            "secretName": secret.name, "items": [{"key": secret.key, "path": "api-key"}]}})
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
        env.append({"name": "FROTA_API_KEY_FILE", "value": f"{API_KEY_DIR}/api-key"})
    pod_labels = labels(isvc, "router")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, router_name(isvc), pod_labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": selector_labels(isvc, **{Label.ROLE: "router"})},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": router_name(isvc),
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "enableServiceLinks": False,
                    "securityContext": pod_security_context(),
                    "containers": [{
                        "name": "router",
                        "image": isvc.spec.engine.image,
                        "imagePullPolicy": isvc.spec.engine.imagePullPolicy,
                        "command": ["frota"],
                        "args": router_args(isvc, topology),
                        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
                        "env": env,
                        "resources": {
                            "requests": {"cpu": router.cpu, "memory": router.memory},
                            "limits": {"memory": router.memory},
                        },
                        "securityContext": container_security_context(),
                        "startupProbe": http_probe("/health", period=2, failures=30),
                        "livenessProbe": http_probe("/health", period=10, failures=3),
                        "readinessProbe": http_probe("/ready", period=5, failures=2),
                        # Leave the Service's endpoints before stopping: kube-proxy on every
                        # node needs a moment to stop sending new connections here.
                        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_ENDPOINT_DRAIN_SECONDS}}},
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    }


def service(isvc: InferenceService) -> dict[str, Any]:
    """The fleet's one endpoint."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(isvc, router_service_name(isvc), labels(isvc, "router")),
        "spec": {
            "type": isvc.spec.router.serviceType,
            "selector": selector_labels(isvc, **{Label.ROLE: "router"}),
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, Service, Deployment."""
    return [service_account(isvc), role(isvc), role_binding(isvc), service(isvc), deployment(isvc, topology)]
