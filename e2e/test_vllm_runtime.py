"""`runtime.engine: vllm` on the cluster: the repository's vLLM CPU sample, served by
the project's own vLLM image (``frota-vllm-cpu:dev``, loaded by e2e/kind/up.sh) behind
Frota's router, its model converted from the worker image's GGUF by an init container.

vLLM needs about a minute to start here (``--optimization-level 0``, no compile), so one
InferenceService serves the module and the tests run in file order.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest
import yaml

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until

SAMPLE = fleet.MANIFESTS / "samples" / "vllm-cpu-smollm2.yaml"
PROMPT = "What is the capital of France? Answer in one word."
# The conversion (~20 s) and vLLM's start (~60 s alone, more under the suite's load).
VLLM_TIMEOUT = 600


def sample(name: str, adapter_uri: str, ca_bundle: dict[str, str]) -> dict[str, Any]:
    """The sample as users apply it, sized for the shared CI node: one replica, one CPU."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    spec = body["spec"]
    assert spec["runtime"]["engine"] == "vllm"
    spec["replicas"] = 1
    spec["resources"]["cpu"] = "1"
    # The images under test: vLLM's for the worker, Frota's for the conversion.
    spec["runtime"]["image"] = fleet.VLLM_IMAGE
    spec["engine"]["image"] = fleet.WORKER_IMAGE
    # An adapter from the in-cluster HTTPS server (e2e/adapter_server.py), fetched by
    # Frota's init container with the test CA, served by vLLM's --lora-modules.
    spec["adapters"] = [{"name": "sql", "uri": adapter_uri}]
    spec["model"]["caBundle"] = ca_bundle
    spec["engine"]["lora"] = {"maxAdapters": 1, "maxRank": 8}
    return body


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str, adapter_server: Any) -> str:
    name = "smollm2-vllm"
    ca = adapter_server.install_ca(cluster, ns)
    cluster.apply(sample(name, adapter_server.uri("sql"), ca), namespace=ns)
    wait_ready(cluster, ns, name, timeout=VLLM_TIMEOUT)
    return name


def test_the_worker_pod_runs_vllm_from_its_image_on_a_converted_model(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    (pod,) = cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
    spec, status = pod["spec"], pod["status"]
    init = next(c for c in spec["initContainers"] if c.get("args", [""])[0] == "convert")
    assert init["image"] == fleet.WORKER_IMAGE, init
    assert any(c["name"].startswith("fetch-adapter") for c in spec["initContainers"])
    for init_status in status["initContainerStatuses"]:
        assert init_status["state"]["terminated"]["exitCode"] == 0, init_status
    (worker,) = spec["containers"]
    assert worker["image"] == fleet.VLLM_IMAGE
    assert worker["command"] == ["vllm", "serve"]
    assert worker["args"][0] == "/models/converted/smollm2"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/health"
    (worker_status,) = status["containerStatuses"]
    assert worker_status["ready"] and worker_status["restartCount"] == 0, worker_status
    # Restricted pod security, as for Frota's own workers: vLLM runs as the image's user.
    assert spec["securityContext"]["runAsUser"] == 10001
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True


def test_vllm_serves_chat_streams_and_completions_through_the_router(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    with router_client(cluster, ns, isvc) as client:
        fleet.check_chat_stream_and_completion(client, PROMPT, models=("smollm2", "sql"))
        # A bad request is vLLM's own 4xx, passed through the router in OpenAI's shape.
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": PROMPT}],
                max_tokens=100_000)


def test_vllm_serves_the_https_adapter_listed_with_its_parent(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    with router_client(cluster, ns, isvc) as client:
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"smollm2", "sql"}, models
        assert getattr(models["sql"], "parent", None) == "smollm2", models["sql"]
        base = chat(client, PROMPT, max_tokens=12)
        reply = client.chat.completions.create(
            model="sql", messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
            temperature=0)
        tuned = reply.choices[0].message.content or ""
    assert tuned and tuned != base, (tuned, base)


def test_the_router_routes_to_the_vllm_worker_and_reads_its_load(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    (router,) = fleet.serving_pods(cluster, ns, isvc, "router")
    (worker,) = fleet.serving_pods(cluster, ns, isvc)
    seen = fleet.metrics(cluster, ns, router, fleet.ROUTER_PORT, "frota_router_")
    routed = {k: v for k, v in seen.items()
              if k.startswith("frota_router_routing_decisions_total") and v > 0}
    assert routed and all('policy="prefix-aware"' in k for k in routed), routed
    healthy = {k: v for k, v in seen.items() if k.startswith("frota_router_worker_healthy")}
    assert list(healthy.values()) == [1.0], healthy
    # vLLM's own metrics, which the router and the autoscaler read by the same names.
    samples = fleet.metrics(cluster, ns, worker, fleet.WORKER_PORT, "vllm:")
    assert any(k.startswith("vllm:num_requests_running") for k in samples), sorted(samples)[:20]
    info = next(k for k in samples if k.startswith("vllm:cache_config_info"))
    assert 'block_size="32"' in info, info
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info))
    kv_tokens = int(labels["block_size"]) * int(labels["num_gpu_blocks"])
    # The operator reports the KV cache vLLM sized for itself beside what it planned.
    reported = wait_until("the reported KV cache in status", lambda: cluster.get(
        "inferenceservice", isvc, ns)["status"]["capacity"].get("reportedKvCacheTokensPerReplica"),
        timeout=90)
    assert reported == kv_tokens, (reported, info)


def test_status_is_ready_with_the_planned_capacity(cluster: Cluster, ns: str, isvc: str) -> None:
    status = cluster.get("inferenceservice", isvc, ns)["status"]
    assert status["readyReplicas"] == 1 and status["replicas"] == 1
    assert status["capacity"]["maxModelLen"] == 2048
    assert status["capacity"]["kvCacheTokensPerReplica"] > 0
    assert fleet.condition(cluster, ns, isvc, "SpecValid")["status"] == "True"


def test_a_deleted_vllm_pod_is_replaced_and_serves_again(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    (old,) = cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
    cluster.kubectl("delete", "pod", old["metadata"]["name"], "-n", ns, "--wait=false")

    def replaced_and_ready() -> bool:
        pods = cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
        return bool(pods) and pods[0]["metadata"]["uid"] != old["metadata"]["uid"] and all(
            c["ready"] for c in pods[0]["status"].get("containerStatuses") or [{"ready": False}])

    wait_until("a new vLLM worker pod, Ready", replaced_and_ready, timeout=VLLM_TIMEOUT)
    wait_ready(cluster, ns, isvc)
    with router_client(cluster, ns, isvc) as client:
        answer = wait_until("the router to serve again", lambda: chat(client, PROMPT), timeout=60)
    assert "paris" in answer.lower(), answer
