"""Router children: Deployment, Service, the ServiceAccount/Role that let it watch EndpointSlices,
and with scale to zero the demand ConfigMap, the one object the router may write."""

from __future__ import annotations

from typing import Any

from frota.api import InferenceService
from frota.api.contract import HTTP_PORT, Demand, Label, Role, ServingPath
from frota.operator.builders import pods
from frota.operator.builders.common import labels, metadata, selector_labels
from frota.operator.builders.fleet_key import fleet_key_mount
from frota.plan.topology import Topology

SERVICE_PORT = 80
API_KEY_DIR = "/var/run/secrets/frota/api-key"
RBAC = "rbac.authorization.k8s.io/v1"
ROUTER_ENDPOINT_DRAIN_SECONDS = 5  # preStop: out of the Service's endpoints before SIGTERM
# After SIGTERM: requests in flight finish (a long generation included) before the
# router stops. With the preStop wait it ends when a worker's drain ends (the pod's grace
# less the margin), so the router never cuts off an answer a worker would have finished.
ROUTER_DRAIN_SECONDS = pods.DRAIN_SECONDS - ROUTER_ENDPOINT_DRAIN_SECONDS


def router_name(isvc: InferenceService) -> str:
    return f"{isvc.metadata.name}-router"


def router_service_name(isvc: InferenceService) -> str:
    """The router's Service carries the InferenceService's own name: http://NAME.NS.svc/v1."""
    return isvc.metadata.name


def demand_configmap_name(isvc: InferenceService) -> str:
    return isvc.metadata.name + Demand.CONFIGMAP_SUFFIX


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
        "--port", str(HTTP_PORT),
        "--policy", topology.router.policy,
        "--drain-timeout", str(ROUTER_DRAIN_SECONDS),
        *topology.router.args,
        *(["--announce-demand", demand_configmap_name(isvc)] if _scales_to_zero(isvc) else []),
    ]


def _scales_to_zero(isvc: InferenceService) -> bool:
    autoscaling = isvc.spec.autoscaling
    return autoscaling is not None and autoscaling.scale_to_zero() is not None


def _router_object(isvc: InferenceService, api_version: str, kind: str, name: str,
                   **fields: Any) -> dict[str, Any]:
    """A child of the router's: its API coordinates, metadata with the router's labels, `fields`."""
    return {"apiVersion": api_version, "kind": kind,
            "metadata": metadata(isvc, name, labels(isvc, Role.ROUTER)), **fields}


def service_account(isvc: InferenceService) -> dict[str, Any]:
    return _router_object(isvc, "v1", "ServiceAccount", router_name(isvc),
                          automountServiceAccountToken=True)


def role(isvc: InferenceService) -> dict[str, Any]:
    """Read-only access to EndpointSlices in the namespace; with scale to zero, also patching
    the fleet's demand ConfigMap, named, and nothing else. The router faces clients: it can
    write nothing that changes what runs (its InferenceService, workloads, Secrets, RBAC)."""
    rules = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["get", "list", "watch"]}]
    if _scales_to_zero(isvc):
        rules.append({"apiGroups": [""], "resources": ["configmaps"],
                      "resourceNames": [demand_configmap_name(isvc)], "verbs": ["patch"]})
    return _router_object(isvc, RBAC, "Role", router_name(isvc), rules=rules)


def role_binding(isvc: InferenceService) -> dict[str, Any]:
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": router_name(isvc)}
    if isvc.metadata.namespace:
        subject["namespace"] = isvc.metadata.namespace
    return _router_object(
        isvc, RBAC, "RoleBinding", router_name(isvc),
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router_name(isvc)},
        subjects=[subject])


def deployment(isvc: InferenceService, topology: Topology) -> dict[str, Any]:
    """The router pods: stateless, rolled one at a time with no capacity loss."""
    router = isvc.spec.router
    env: list[dict[str, Any]] = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    env += [{"name": k, "value": v} for k, v in topology.router.env.items()]
    env += pods.WRITABLE_HOME_ENV
    tmp, tmp_mount = pods.tmp_volume()
    key, key_mount, key_env = fleet_key_mount(isvc)
    volumes, mounts = [tmp, key], [tmp_mount, key_mount]
    env.append(key_env)
    if router.apiKeySecret is not None:
        # A file, not an env var: the key stays out of `kubectl describe` and process listings.
        secret = router.apiKeySecret
        volumes.append({"name": "api-key", "secret": {
            "secretName": secret.name, "items": [{"key": secret.key, "path": "api-key"}]}})
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
        env.append({"name": "FROTA_API_KEY_FILE", "value": f"{API_KEY_DIR}/api-key"})
    pod_labels = labels(isvc, Role.ROUTER)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(isvc, router_name(isvc), pod_labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": selector_labels(isvc, **{Label.ROLE: Role.ROUTER})},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": router_name(isvc),
                    "terminationGracePeriodSeconds": pods.TERMINATION_GRACE_SECONDS,
                    "enableServiceLinks": False,
                    "securityContext": pods.pod_security_context(),
                    "containers": [{
                        "name": "router",
                        "image": isvc.spec.engine.image,
                        "imagePullPolicy": isvc.spec.engine.imagePullPolicy,
                        "command": ["frota"],
                        "args": router_args(isvc, topology),
                        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
                        "env": env,
                        "resources": {
                            "requests": {"cpu": router.cpu, "memory": router.memory},
                            "limits": {"memory": router.memory},
                        },
                        "securityContext": pods.container_security_context(),
                        "startupProbe": pods.http_probe(ServingPath.HEALTH, period=2, failures=30),
                        "livenessProbe": pods.http_probe(ServingPath.HEALTH, period=10, failures=3),
                        "readinessProbe": pods.http_probe(ServingPath.READY, period=5, failures=2),
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
    return _router_object(isvc, "v1", "Service", router_service_name(isvc), spec={
        "type": isvc.spec.router.serviceType,
        "selector": selector_labels(isvc, **{Label.ROLE: Role.ROUTER}),
        "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
    })


def demand_configmap(isvc: InferenceService) -> dict[str, Any]:
    """Where the router of a fleet at zero stamps a held request (`contract.Demand`). No data:
    the router writes its one key, and the operator's apply never touches it."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(isvc, demand_configmap_name(isvc),
                                 labels(isvc, **{Label.COMPONENT: Demand.COMPONENT}))}


def router_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, Service, Deployment; the demand ConfigMap before
    them with scale to zero."""
    demand = [demand_configmap(isvc)] if _scales_to_zero(isvc) else []
    return [*demand, service_account(isvc), role(isvc), role_binding(isvc), service(isvc),
            deployment(isvc, topology)]
