"""Scale to zero on the cluster: an idle fleet goes to zero worker pods and keeps its router;
requests sent at zero are held and all answered once the router's demand brought a replica
back (the router stamps the fleet's demand ConfigMap, the one object its Role lets it write,
and the operator answers the stamp); a request held past `holdSeconds` gets a 503 with
Retry-After.

The cold start (first held request to its first token) is printed as a breakdown from the
pod's own timestamps and the worker's log: scheduling, container start, process start,
weight load, kernel load, warm-up, readiness. It is measured,
not asserted (docs/benchmarks.md records it). The tests run in file order on one
InferenceService.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import time
from typing import Any

import openai
import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until
from frota.api.contract import Demand

NAME = "idle"
PROMPT = "What is the capital of France? Answer in one word."
IDLE_SECONDS = 10
# Idle time, the operator's autoscaling tick (15 s) and the pod's termination.
TO_ZERO_TIMEOUT = IDLE_SECONDS + 90


def autoscaling(hold_seconds: int) -> dict[str, Any]:
    return {"minReplicas": 0, "maxReplicas": 1, "target": 4,
            "scaleToZero": {"idleSeconds": IDLE_SECONDS, "holdSeconds": hold_seconds}}


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str) -> str:
    body = fleet.small_isvc(NAME, autoscaling=autoscaling(hold_seconds=240))
    del body["spec"]["replicas"]  # the autoscaler owns it, as in a GitOps manifest
    cluster.apply(body, namespace=ns)
    wait_ready(cluster, ns, NAME)
    return NAME


def workers(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    return [p for p in cluster.get("pods", namespace=ns, **{INSTANCE: NAME, ROLE: "worker"})
            if not p["metadata"].get("deletionTimestamp")]


def at_zero(cluster: Cluster, ns: str) -> None:
    """Wait for zero worker pods and the Ready=True ScaledToZero condition."""
    wait_until("zero worker pods", lambda: not cluster.get(
        "pods", namespace=ns, **{INSTANCE: NAME, ROLE: "worker"}), timeout=TO_ZERO_TIMEOUT)
    wait_until("Ready=True, ScaledToZero", lambda: (
        c := fleet.condition(cluster, ns, NAME, "Ready")).get("reason") == "ScaledToZero"
        and c.get("status") == "True", timeout=60)


def test_an_idle_fleet_goes_to_zero_workers_and_keeps_its_router(
        cluster: Cluster, ns: str, isvc: str) -> None:
    with router_client(cluster, ns, isvc) as client:
        assert "paris" in chat(client, PROMPT).lower()
    at_zero(cluster, ns)
    isvc_body = cluster.get("inferenceservice", NAME, ns)
    assert isvc_body["spec"]["replicas"] == 0 and isvc_body["status"]["readyReplicas"] == 0
    assert fleet.serving_pods(cluster, ns, NAME, "router")  # the router stays up
    reasons = [e["reason"] for e in cluster.get("events", namespace=ns)
               if e["involvedObject"].get("name") == NAME]
    assert "ScaledDown" in reasons, reasons


def _ts(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def worker_phases(log: str) -> dict[str, float]:
    """From the worker's JSON log lines: when it began to load the model (`loading_at`),
    the seconds its kernels took to load, the whole load (weights, kernels, engine) and the
    warm-up."""
    phases = {"kernel_load_s": 0.0}
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if str(record.get("msg", "")).startswith("loading model"):
            phases["loading_at"] = _ts(record["ts"])
        phases["kernel_load_s"] += record.get("kernel_load_s", 0.0)
        if "warmup_s" in record:
            phases.update(load_s=record["load_s"], warmup_s=record["warmup_s"])
    return phases


def cold_start_breakdown(pod: dict[str, Any], log: str, sent: float,
                         first_token: float) -> dict[str, float]:
    """Seconds of each phase from the first held request to its first token: the pod's own
    timestamps, and the worker's log for what happens inside the container."""
    conditions = {c["type"]: _ts(c["lastTransitionTime"]) for c in pod["status"]["conditions"]}
    (container,) = pod["status"]["containerStatuses"]
    started = _ts(container["state"]["running"]["startedAt"])
    created = _ts(pod["metadata"]["creationTimestamp"])
    worker = worker_phases(log)
    inside: dict[str, float] = {  # what the worker's log tells; without it, one lump
        "model_load_to_ready_s": round(conditions["Ready"] - started, 2)}
    if {"loading_at", "load_s", "warmup_s"} <= worker.keys():
        warmed = worker["loading_at"] + worker["load_s"] + worker["warmup_s"]
        inside = {
            "process_start_s": round(worker["loading_at"] - started, 2),  # Python, torch, the server
            "weight_load_s": round(worker["load_s"] - worker["kernel_load_s"], 2),  # and KV cache
            "kernel_load_s": round(worker["kernel_load_s"], 2),
            "warm_up_s": round(worker["warmup_s"], 2),
            "readiness_probe_s": round(conditions["Ready"] - warmed, 2),
        }
    return {
        "demand_to_pod_created_s": round(created - sent, 2),
        "scheduling_s": round(conditions["PodScheduled"] - created, 2),
        "container_start_s": round(started - conditions["PodScheduled"], 2),
        **inside,
        "ready_to_first_token_s": round(first_token - conditions["Ready"], 2),
        "total_s": round(first_token - sent, 2),
    }


def test_requests_sent_at_zero_are_held_and_all_answered(
        cluster: Cluster, ns: str, isvc: str) -> None:
    with router_client(cluster, ns, isvc) as client:
        sent = time.time()

        def first_token_time() -> tuple[float, str]:
            stream = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": PROMPT}],
                max_tokens=8, temperature=0, stream=True)
            first, pieces = None, []
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.time()
                    pieces.append(chunk.choices[0].delta.content)
            return first or time.time(), "".join(pieces)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            streamed = pool.submit(first_token_time)
            rest = [pool.submit(chat, client, PROMPT) for _ in range(7)]
            first_token, text = streamed.result(timeout=300)
            answers = [f.result(timeout=300) for f in rest]
    assert "paris" in text.lower(), text
    assert all("paris" in a.lower() for a in answers), answers  # 8 of 8: none lost
    (pod,) = workers(cluster, ns)
    log = cluster.kubectl("logs", "-n", ns, pod["metadata"]["name"], check=False)
    breakdown = cold_start_breakdown(pod, log, sent, first_token)
    print("cold start from zero:", json.dumps(breakdown))
    events = [e for e in cluster.get("events", namespace=ns)
              if e["involvedObject"].get("name") == NAME and e["reason"] == "ScaledUp"]
    assert any("holds a request" in e["message"] for e in events), [e["message"] for e in events]
    # The demand came through the ConfigMap the router may patch, not its InferenceService.
    demand = cluster.get("configmap", NAME + Demand.CONFIGMAP_SUFFIX, ns)
    assert _ts(demand["data"][Demand.DATA_KEY]) >= sent - 5


def test_a_request_held_past_hold_seconds_gets_503_with_retry_after(
        cluster: Cluster, ns: str, isvc: str) -> None:
    body = cluster.get("inferenceservice", NAME, ns)
    body["spec"]["autoscaling"] = autoscaling(hold_seconds=2)  # shorter than a cold start
    cluster.apply({"apiVersion": body["apiVersion"], "kind": body["kind"],
                   "metadata": {"name": NAME}, "spec": body["spec"]}, namespace=ns)
    at_zero(cluster, ns)
    def rolled() -> bool:  # every router pod left runs with the new hold time, and is Ready
        pods = cluster.get("pods", namespace=ns, **{INSTANCE: NAME, ROLE: "router"})
        args = [p["spec"]["containers"][0]["args"] for p in pods]
        return bool(pods) and len(fleet.serving_pods(cluster, ns, NAME, "router")) == len(pods) \
            and all(a[a.index("--hold-seconds") + 1] == "2" for a in args)

    wait_until("the router rolled out with --hold-seconds 2", rolled, timeout=180)
    wait_ready(cluster, ns, NAME)
    with router_client(cluster, ns, isvc) as client, \
            pytest.raises(openai.APIStatusError) as refused:
        client.with_options(max_retries=0).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": PROMPT}], max_tokens=4)
    assert refused.value.status_code == 503
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert refused.value.code == "hold_timeout"
