"""What the serving e2e tests share: the installed operator, InferenceServices, the router's address.

The operator runs in the cluster from ``manifests/overlays/dev`` (one ``kubectl
apply -k``), under its own ServiceAccount: what it may do is exactly what the
ClusterRole grants. Model pods are kept small (one or two at a time, a KV
cache of a few thousand tokens): a SmolLM2 worker takes about 1-1.5 GB.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

from e2e.kube import Cluster, make_namespace, pod_is_ready, wait_until

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
OVERLAY = MANIFESTS / "overlays" / "dev"
OPERATOR_NS = "frota-system"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NS}:frota-operator"
INSTANCE = "app.kubernetes.io/instance"
ROLE = "frota.dev/role"
REPLICA = "frota.dev/replica"  # a pod's replica group
ROUTER_PORT = 8000
OPERATOR_METRICS_PORT = 9090
WORKER_PORT = 8000
# Every kind of child the operator renders (what garbage collection must take).
CHILD_KINDS = ("statefulsets", "services", "deployments", "configmaps", "serviceaccounts",
               "roles", "rolebindings", "poddisruptionbudgets", "networkpolicies", "pods")
WORKER_IMAGE = os.environ.get("FROTA_E2E_IMAGE", "frota-worker:dev")
VLLM_IMAGE = os.environ.get("FROTA_E2E_VLLM_IMAGE", "frota-vllm-cpu:dev")
# Loading a model is 15-50 s here, more while another loads beside it.
MODEL_TIMEOUT = 240


def install_operator(cluster: Cluster) -> None:
    """Apply the dev overlay (CRDs, RBAC, Deployment) in one step; wait until the operator is Available."""
    cluster.kubectl("apply", "--server-side", "--field-manager=frota-e2e", "-k", str(OVERLAY))
    wait_until("the operator Deployment to become Available",
               lambda: any(c["type"] == "Available" and c["status"] == "True" for c in
                           cluster.get("deployment", "frota-operator", OPERATOR_NS)["status"]
                           .get("conditions", [])),
               timeout=120)


def operator_pod(cluster: Cluster) -> dict[str, Any]:
    """The one live, Ready operator pod."""
    pods = [p for p in cluster.get("pods", namespace=OPERATOR_NS,
                                   **{"app.kubernetes.io/component": "operator"})
            if not p["metadata"].get("deletionTimestamp") and pod_is_ready(p)]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    """A restricted namespace for a whole module, deleted (without waiting) afterwards."""
    name = make_namespace(cluster)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def small_isvc(name: str, **spec: Any) -> dict[str, Any]:
    """An InferenceService of SmolLM2 on CPU sized for a shared machine: small KV cache, few sequences."""
    body: dict[str, Any] = {
        "model": {"name": "smollm2", "uri": "alias:smollm2"},
        "engine": {
            "dtype": "float32", "maxModelLen": 1024,
            # 2Gi x 0.7 leaves ~150 MiB of KV cache (3,456 tokens) after weights and runtime.
            "kvCache": {"memoryFraction": 0.7},
            "scheduler": {"maxNumSeqs": 4},
        },
        "resources": {"cpu": "500m", "memory": "2Gi"},
        "replicas": 1,
        "router": {"policy": "least-load"},
    }
    body.update(spec)
    # The image under test (loaded into the nodes by e2e/kind/up.sh), not the published default.
    body["engine"].setdefault("image", WORKER_IMAGE)
    return {"apiVersion": "frota.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": body}


def condition(cluster: Cluster, namespace: str, name: str, type_: str) -> dict[str, Any]:
    """One status condition of an InferenceService ({} when not there yet)."""
    status = cluster.get("inferenceservice", name, namespace).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = MODEL_TIMEOUT) -> None:
    """Wait for Ready=True at the current generation."""
    def ready() -> bool:
        isvc = cluster.get("inferenceservice", name, namespace)
        status = isvc.get("status") or {}
        cond = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        return (cond.get("status") == "True"
                and status.get("observedGeneration") == isvc["metadata"]["generation"])

    try:
        wait_until(f"InferenceService {namespace}/{name} to be Ready", ready, timeout=timeout)
    except AssertionError:
        print(describe(cluster, namespace, name))
        raise


def describe(cluster: Cluster, namespace: str, name: str) -> str:
    """Status, pods and recent logs: what a failure needs to be understood."""
    out = [cluster.kubectl("get", "inferenceservice,statefulsets,pods,endpointslices", "-n",
                           namespace, "-o", "wide", check=False)]
    status = cluster.kubectl("get", "inferenceservice", name, "-n", namespace, "-o",
                             "jsonpath={.status}", check=False)
    out.append(status)
    for pod in cluster.get("pods", namespace=namespace, **{INSTANCE: name}):
        pname = pod["metadata"]["name"]
        out.append(f"--- {pname}\n" + cluster.kubectl("logs", "-n", namespace, pname,
                                                      "--tail=30", check=False))
    return "\n".join(out)


def groups(cluster: Cluster, namespace: str, name: str, role: str = "worker") -> list[str]:
    """The names of the replica groups (StatefulSets) of one role."""
    return sorted(s["metadata"]["name"] for s in cluster.get(
        "statefulsets", namespace=namespace, **{INSTANCE: name, ROLE: role}))


def serving_pods(cluster: Cluster, namespace: str, name: str, role: str = "worker") -> list[str]:
    """Ready, live pods of one role."""
    return sorted(p["metadata"]["name"] for p in cluster.get(
        "pods", namespace=namespace, **{INSTANCE: name, ROLE: role})
        if pod_is_ready(p) and not p["metadata"].get("deletionTimestamp"))


@contextlib.contextmanager
def router_client(cluster: Cluster, namespace: str, name: str) -> Iterator[openai.OpenAI]:
    """The official openai client pointed at a Ready router pod."""
    pod = wait_until("a Ready router pod", lambda: serving_pods(cluster, namespace, name, "router"))[0]
    with cluster.reach(namespace, pod, ROUTER_PORT) as (host, port):
        client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        try:
            yield client
        finally:
            client.close()


def chat(client: openai.OpenAI, prompt: str, max_tokens: int = 12) -> str:
    """One greedy chat completion's text."""
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content or ""


def check_chat_stream_and_completion(client: openai.OpenAI, prompt: str,
                                     models: tuple[str, ...] = ("smollm2",)) -> str:
    """The OpenAI surface every serving fleet must answer, through its router: the model
    list, a greedy chat answer naming Paris, the same tokens streamed, a completion.
    Returns the chat answer. ``models``: what /v1/models lists (the base, then any adapters)."""
    assert [m.id for m in client.models.list().data] == list(models)
    messages = [{"role": "user", "content": prompt}]
    reply = client.chat.completions.create(model="smollm2", messages=messages,
                                           max_tokens=12, temperature=0)
    answer = reply.choices[0].message.content or ""
    assert "paris" in answer.lower(), answer
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="smollm2", messages=messages,
                                            max_tokens=12, temperature=0, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 1, pieces
    assert "".join(pieces) == answer  # greedy: the same tokens, streamed
    completion = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert "paris" in completion.choices[0].text.lower(), completion.choices[0].text
    return answer


def metrics(cluster: Cluster, ns: str, pod: str, port: int, prefix: str) -> dict[str, float]:
    """A pod's Prometheus samples whose names start with ``prefix`` (name{labels} -> value)."""
    with cluster.reach(ns, pod, port) as (host, reached):
        text = httpx.get(f"http://{host}:{reached}/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def can_i(cluster: Cluster, verb: str, resource: str, namespace: str | None = None) -> bool:
    """Whether the operator's ServiceAccount may do ``verb`` on ``resource``."""
    ns = ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = subprocess.run(
        [cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, "auth", "can-i", verb,
         resource, "--as", OPERATOR_SA, *ns], capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() == "yes"


def resource_versions(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    """kind/name -> resourceVersion of every child (pods included)."""
    out = json.loads(cluster.kubectl("get", ",".join(CHILD_KINDS), "-n", namespace, "-l",
                                     f"{INSTANCE}={name}", "-o", "json"))
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
            for o in out["items"]}
