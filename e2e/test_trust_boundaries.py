"""Trust boundaries on the cluster: the router, the pod that faces clients, cannot change its
fleet, and each fleet has a key of its own that it owns.

One InferenceService that scales to zero, made at zero (spec.replicas 0): no worker starts,
so this needs no model and nothing the other modules do not share (the cluster, the
operator, the worker image for the router). The API server itself answers for RBAC
(`kubectl auth can-i --as` the router's ServiceAccount), not a reading of the Role.
"""

from __future__ import annotations

import base64
import re

import pytest

from e2e import fleet
from e2e.fleet import INSTANCE
from e2e.kube import Cluster, wait_until
from frota.api.contract import Demand, FleetKey

NAME = "trust"
SCALE_TO_ZERO = {"minReplicas": 0, "maxReplicas": 1, "target": 4, "scaleToZero": {}}


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str) -> str:
    cluster.apply(fleet.small_isvc(NAME, replicas=0, autoscaling=SCALE_TO_ZERO), namespace=ns)
    wait_until("the router's RoleBinding, the demand ConfigMap and the fleet key", lambda: (
        cluster.get("rolebindings", namespace=ns, **{INSTANCE: NAME})
        and cluster.get("configmap", NAME + Demand.CONFIGMAP_SUFFIX, ns)
        and cluster.get("secret", NAME + FleetKey.SECRET_SUFFIX, ns)), timeout=60)
    return NAME


def router_can(cluster: Cluster, ns: str, verb: str, resource: str) -> str:
    """The API server's answer, yes or no, for the router's ServiceAccount."""
    return cluster.kubectl("auth", "can-i", verb, resource, "-n", ns,
                           "--as", f"system:serviceaccount:{ns}:{NAME}-router", check=False).strip()


def test_the_router_cannot_change_its_fleet_and_the_fleet_owns_its_key(
        cluster: Cluster, ns: str, isvc: str) -> None:
    demand = NAME + Demand.CONFIGMAP_SUFFIX
    answers = {(verb, resource): router_can(cluster, ns, verb, resource) for verb, resource in [
        ("patch", f"inferenceservices.frota.dev/{isvc}"),  # its image is the workers' code
        ("update", f"inferenceservices.frota.dev/{isvc}"),
        ("patch", f"configmaps/{NAME}-engine"),  # the workers' flags
        ("get", f"secrets/{NAME}{FleetKey.SECRET_SUFFIX}"),  # it reads its mount, not the API
        ("create", "pods"),
        ("patch", f"deployments.apps/{NAME}-router"),
        ("create", "rolebindings.rbac.authorization.k8s.io"),
        ("patch", f"configmaps/{demand}"),  # the one write it has: scale to zero's demand
        ("watch", "endpointslices.discovery.k8s.io"),  # discovery
    ]}
    assert answers == {**{k: "no" for k in answers},
                       ("patch", f"configmaps/{demand}"): "yes",
                       ("watch", "endpointslices.discovery.k8s.io"): "yes"}

    owner = cluster.get("inferenceservice", isvc, ns)
    secret = cluster.get("secret", NAME + FleetKey.SECRET_SUFFIX, ns)
    key = base64.b64decode(secret["data"][FleetKey.DATA_KEY]).decode()
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    (ref,) = secret["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == (
        "InferenceService", owner["metadata"]["uid"], True)
    router = cluster.get("deployment", f"{NAME}-router", ns)["spec"]["template"]["spec"]
    (volume,) = [v for v in router["volumes"] if v.get("secret", {}).get("secretName")
                 == NAME + FleetKey.SECRET_SUFFIX]
    (mount,) = [m for m in router["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == FleetKey.MOUNT_DIR and mount["readOnly"] and "subPath" not in mount
