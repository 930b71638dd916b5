"""The cluster itself behaves like Kubernetes: what every other e2e test builds on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e.kube import RESTRICTED_CONTAINER, RESTRICTED_POD, Cluster, pod_is_ready, wait_until

CRDS = Path(__file__).resolve().parents[1] / "crds"

# Answers GET /resolve?name=X with the addresses X resolves to inside the pod.
RESOLVER = """
import http.server, json, socket, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        q = urllib.parse.urlparse(self.path)
        name = urllib.parse.parse_qs(q.query).get("name", [""])[0]
        try:
            body = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})
        except OSError:
            body = []
        data = json.dumps({"addresses": body, "hostname": socket.gethostname()}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)
http.server.HTTPServer(("", 8080), H).serve_forever()
"""


def _http_probe(port: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1, "failureThreshold": 3}


def _deployment(name: str, image: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "terminationGracePeriodSeconds": 5,
                "securityContext": RESTRICTED_POD,
                "containers": [{
                    "name": "web", "image": image, "securityContext": RESTRICTED_CONTAINER,
                    "command": ["python", "-m", "http.server", "8080"],
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "readinessProbe": _http_probe(8080),
                }],
            }},
        },
    }


def test_apiserver_answers_readyz(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").strip() == "ok"


def test_nodes_are_ready_and_keep_their_leases(cluster: Cluster) -> None:
    nodes = cluster.get("nodes")
    assert nodes
    for node in nodes:
        name = node["metadata"]["name"]
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
        lease = cluster.get("lease", name, "kube-node-lease")
        assert lease["spec"]["holderIdentity"] == name
        assert lease["spec"]["renewTime"]


def test_crds_are_accepted_by_the_apiserver(cluster: Cluster) -> None:
    docs = [d for f in sorted(CRDS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    names = [d["metadata"]["name"] for d in docs if d.get("kind") == "CustomResourceDefinition"]
    assert names, "crds/ holds no CRD"
    how = ["-k", str(CRDS)] if (CRDS / "kustomization.yaml").exists() else ["-f", str(CRDS)]
    cluster.kubectl("apply", "--server-side", "--field-manager=frota-e2e", *how)
    cluster.wait_crds_established(names)


def test_deployment_pod_is_scheduled_runs_and_becomes_ready(cluster: Cluster, namespace: str) -> None:
    cluster.apply(_deployment("web", cluster.image), namespace=namespace)
    pod = wait_until(
        "a Ready pod of the Deployment",
        lambda: next((p for p in cluster.get("pods", namespace=namespace, app="web") if pod_is_ready(p)), None),
    )
    assert pod["spec"]["nodeName"]
    assert pod["status"]["podIP"]
    with cluster.reach(namespace, pod["metadata"]["name"], 8080) as (host, port):
        assert httpx.get(f"http://{host}:{port}/", timeout=10).status_code == 200
    logs = wait_until(
        "the request in the container's log",
        lambda: (out := cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"])) and "GET /" in out and out,
    )
    assert "HTTP/1.1\" 200" in logs
    dep = wait_until(
        "the Deployment to report one ready replica",
        lambda: (d := cluster.get("deployment", "web", namespace))["status"].get("readyReplicas") == 1 and d,
    )
    assert dep["status"]["availableReplicas"] == 1


def test_statefulset_pods_resolve_each_other_through_the_headless_service(
    cluster: Cluster, namespace: str
) -> None:
    labels = {"app": "peers"}
    svc = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"},
        "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 8080}],
                 "publishNotReadyAddresses": True},
    }
    sts = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "peer"},
        "spec": {
            "serviceName": "peers", "replicas": 2, "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "terminationGracePeriodSeconds": 5,
                "securityContext": RESTRICTED_POD,
                "containers": [{
                    "name": "resolver", "image": cluster.image,
                    "securityContext": RESTRICTED_CONTAINER,
                    "command": ["python", "-c", RESOLVER],
                    "readinessProbe": _http_probe(8080),
                }],
            }},
        },
    }
    cluster.apply(svc, sts, namespace=namespace)
    pods = wait_until(
        "both StatefulSet pods Ready",
        lambda: (ps := cluster.get("pods", namespace=namespace, app="peers"))
        and len(ps) == 2 and all(pod_is_ready(p) for p in ps) and ps,
    )
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    assert set(ips) == {"peer-0", "peer-1"}
    with cluster.reach(namespace, "peer-1", 8080) as (host, port):
        def ask(name: str) -> dict[str, Any]:
            return json.loads(httpx.get(f"http://{host}:{port}/resolve", params={"name": name}, timeout=10).text)

        def resolves(name: str, addresses: list[str]) -> None:
            # CoreDNS follows the API through a watch, with a lag: wait, then compare.
            def check() -> bool:
                got = ask(name)["addresses"]
                assert got == addresses, f"{name} resolved to {got}"
                return True

            wait_until(f"{name} to resolve to {addresses}", check, timeout=30)

        resolves("peer-0.peers", [ips["peer-0"]])
        resolves(f"peer-0.peers.{namespace}.svc.cluster.local", [ips["peer-0"]])
        resolves("peers", sorted(ips.values()))
        assert ask("peer-1.peers")["hostname"] == "peer-1"


def test_deleting_a_deployment_garbage_collects_its_pods(cluster: Cluster, namespace: str) -> None:
    cluster.apply(_deployment("gc", cluster.image), namespace=namespace)
    wait_until(
        "the Deployment's pod to run",
        lambda: any(pod_is_ready(p) for p in cluster.get("pods", namespace=namespace, app="gc")),
    )
    cluster.kubectl("delete", "deployment", "gc", "-n", namespace, "--wait=false")
    wait_until(
        "the ReplicaSet and pods to be garbage-collected",
        lambda: not cluster.get("replicasets", namespace=namespace)
        and not cluster.get("pods", namespace=namespace, app="gc"),
        timeout=60,
    )
