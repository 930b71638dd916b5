"""Pods see what they would see on a real node: env, volumes, identity, restarts, extended resources."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.kube import Cluster, restricted, wait_until

# Prints what the pod sees as one JSON line, then exits 0.
INSPECT = """
import json, os, ssl, socket, urllib.request, urllib.error
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
out = {k: os.environ.get(k) for k in ("POD_NAME", "POD_IP", "NODE", "RANK", "MEM_MI", "GREETING",
                                      "HOSTNAME")}
out["hostname"] = socket.gethostname()
out["namespace"] = open(sa + "/namespace").read()
out["config"] = open("/etc/frota-e2e/config/greeting").read()
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
def call(path, base=f"https://{host}:{port}"):
    req = urllib.request.Request(base + path,
                                 headers={"Authorization": "Bearer " + open(sa + "/token").read()})
    try:
        return urllib.request.urlopen(req, context=ctx, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
out["get_own_namespace_pods"] = call(f"/api/v1/namespaces/{out['namespace']}/pods")
out["get_version"] = call("/version")
out["get_version_by_service_name"] = call("/version", "https://kubernetes.default.svc")
print(json.dumps(out), flush=True)
"""


def _inspect_pod(image: str, gpus: int) -> dict[str, Any]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    container: dict[str, Any] = {
        "name": "inspect", "image": image, "command": ["python", "-c", INSPECT],
        "env": [
            {"name": "POD_NAME", **field("metadata.name")},
            {"name": "POD_IP", **field("status.podIP")},
            {"name": "NODE", **field("spec.nodeName")},
            {"name": "RANK", **field("metadata.labels['rank']")},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {
                "resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {
                "name": "inspect", "key": "greeting"}}},
        ],
        "resources": {"limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/frota-e2e/config"}],
    }
    if gpus:
        container["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    return restricted({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "inspect", "labels": {"rank": "3"}},
        "spec": {
            "restartPolicy": "Never", "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": "inspect"}}],
        },
    })


def _gpus_per_node(cluster: Cluster) -> int:
    return max(
        (int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) for n in cluster.get("nodes")),
        default=0,
    )


def _run_to_completion(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    obj = wait_until(
        f"pod {pod} to finish",
        lambda: (p := cluster.get("pod", pod, namespace))["status"].get("phase") in ("Succeeded", "Failed") and p,
    )
    logs = cluster.kubectl("logs", "-n", namespace, pod)
    assert obj["status"]["phase"] == "Succeeded", logs
    return json.loads(logs.strip().splitlines()[-1])


def test_pod_sees_downward_api_config_and_its_own_service_account(cluster: Cluster, namespace: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inspect"},
          "data": {"greeting": "hello"}}
    cluster.apply(cm, _inspect_pod(cluster.image, gpus=0), namespace=namespace)
    seen = _run_to_completion(cluster, namespace, "inspect")
    pod = cluster.get("pod", "inspect", namespace)
    assert seen["POD_NAME"] == seen["HOSTNAME"] == seen["hostname"] == "inspect"
    assert seen["POD_IP"] == pod["status"]["podIP"]
    assert seen["NODE"] == pod["spec"]["nodeName"]
    assert (seen["RANK"], seen["MEM_MI"], seen["GREETING"], seen["config"]) == ("3", "256", "hello", "hello")
    assert seen["namespace"] == namespace
    # RBAC is enforced: the default account may read /version but not list pods.
    assert (seen["get_version"], seen["get_own_namespace_pods"]) == (200, 403)
    assert seen["get_version_by_service_name"] == 200


def test_pod_asking_for_more_gpus_than_a_node_has_is_unschedulable(cluster: Cluster, namespace: str) -> None:
    per_node = _gpus_per_node(cluster)
    if per_node < 1:
        pytest.skip("no node advertises nvidia.com/gpu")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inspect"},
          "data": {"greeting": "hello"}}
    cluster.apply(cm, _inspect_pod(cluster.image, gpus=per_node), namespace=namespace)
    _run_to_completion(cluster, namespace, "inspect")  # as many as a node has: scheduled
    too_big = _inspect_pod(cluster.image, gpus=per_node + 1)
    too_big["metadata"]["name"] = "too-big"
    cluster.apply(too_big, namespace=namespace)
    wait_until(
        "the scheduler to report the oversized pod unschedulable",
        lambda: any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in cluster.get("pod", "too-big", namespace)["status"].get("conditions", [])
        ),
    )


def test_crashing_container_is_restarted_with_back_off(cluster: Cluster, namespace: str) -> None:
    pod = restricted({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crash"},
        "spec": {"containers": [{"name": "c", "image": cluster.image,
                                 "command": ["python", "-c", "import sys; sys.exit(3)"]}]},
    })
    cluster.apply(pod, namespace=namespace)
    status = wait_until(
        "two restarts",
        lambda: (cs := cluster.get("pod", "crash", namespace)["status"].get("containerStatuses"))
        and cs[0]["restartCount"] >= 2 and cs[0],
    )
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert cluster.get("pod", "crash", namespace)["status"]["phase"] == "Running"


def test_init_container_runs_to_completion_before_the_main_container(
    cluster: Cluster, namespace: str
) -> None:
    write = "open('/data/ready', 'w').write('from-init')"
    read = "import sys; sys.exit(0 if open('/data/ready').read() == 'from-init' else 1)"
    pod = restricted({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "init"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "prepare", "image": cluster.image,
                                "command": ["python", "-c", write],
                                "volumeMounts": [{"name": "work", "mountPath": "/data"}]}],
            "containers": [{"name": "main", "image": cluster.image,
                            "command": ["python", "-c", read],
                            "volumeMounts": [{"name": "work", "mountPath": "/data"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}],
        },
    })
    cluster.apply(pod, namespace=namespace)
    wait_until(
        "the pod to succeed",
        lambda: cluster.get("pod", "init", namespace)["status"].get("phase") == "Succeeded",
    )
