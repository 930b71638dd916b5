"""Tensor-parallel and disaggregated fleets serve correct output through the router; the
disaggregated fleet keeps its internal protocol to itself (docs/security.md).
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator

import openai
import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until
from frota.api.contract import FleetKey, InternalHeader
from frota.api.fleet_key import generate_key

PROMPT = "What is the capital of France? Answer in one word."
# SmolLM2 has 9 attention heads, which 2 does not divide: tensor parallel
# runs a seeded synthetic model, checked against the same model on one rank.
SYNTHETIC = "synthetic:dense-small"
SYNTHETIC_NAME = "dense-small"
SERVICE_PORT = 80  # the router Service's


@contextlib.contextmanager
def running(cluster: Cluster, ns: str, manifest: dict) -> Iterator[str]:
    """An InferenceService applied and Ready; deleted, children and all, afterwards."""
    name = manifest["metadata"]["name"]
    cluster.apply(manifest, namespace=ns)
    try:
        wait_ready(cluster, ns, name)
        yield name
    finally:
        cluster.kubectl("delete", "inferenceservice", name, "-n", ns, "--wait=false", check=False)
        # Model pods are memory: the next fleet starts only when these are gone.
        wait_until(f"{name}'s pods gone", lambda: not cluster.get(
            "pods", namespace=ns, **{INSTANCE: name}), timeout=120)


def _completion(cluster: Cluster, ns: str, name: str, prompt: str) -> str:
    with router_client(cluster, ns, name) as client:
        return client.completions.create(model=SYNTHETIC_NAME, prompt=prompt, max_tokens=8,
                                         temperature=0).choices[0].text


def test_tensor_parallel_two_pods_serve_what_one_rank_serves(cluster: Cluster, ns: str) -> None:
    engine = {"dtype": "float32", "maxModelLen": 256, "kvCache": {"memoryFraction": 0.6},
              "scheduler": {"maxNumSeqs": 2}}
    small = {"cpu": "250m", "memory": "1536Mi"}  # the runtime reserve is 768 MiB
    prompts = ["hello world", "the quick brown fox"]
    one = fleet.small_isvc("tp1", model={"name": SYNTHETIC_NAME, "uri": SYNTHETIC},
                           engine=engine, resources=small)
    with running(cluster, ns, one) as name:
        expected = [_completion(cluster, ns, name, p) for p in prompts]
    two = fleet.small_isvc("tp2", model={"name": SYNTHETIC_NAME, "uri": SYNTHETIC},
                           engine=engine, resources=small, parallelism={"tensor": 2})
    with running(cluster, ns, two) as name:
        pods = cluster.get("pods", namespace=ns, **{INSTANCE: name, ROLE: "worker"})
        assert sorted(p["metadata"]["name"] for p in pods) == ["tp2-worker-0-0", "tp2-worker-0-1"]
        assert [_completion(cluster, ns, name, p) for p in prompts] == expected
    assert all(expected), expected


@pytest.fixture(scope="module")
def pd(cluster: Cluster, ns: str) -> Iterator[str]:
    """A disaggregated fleet (every prompt goes prefill -> KV handle -> decode), shared by
    the tests below and deleted after them."""
    manifest = fleet.small_isvc(
        "pd", disaggregation={"minPromptTokens": 0, "prefill": {"replicas": 1},
                              "decode": {"replicas": 1}})
    with running(cluster, ns, manifest) as name:
        yield name


def test_disaggregated_fleet_serves_through_prefill_and_decode(cluster: Cluster, ns: str,
                                                               pd: str) -> None:
    name = pd
    assert fleet.groups(cluster, ns, name, "prefill") == ["pd-prefill-0"]
    assert fleet.groups(cluster, ns, name, "decode") == ["pd-decode-0"]
    with router_client(cluster, ns, name) as client:
        answer = chat(client, PROMPT)
        stream = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": PROMPT}],
            max_tokens=12, temperature=0, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "paris" in answer.lower(), answer
    assert streamed == answer
    # Both went prefill -> KV handle -> decode (minPromptTokens 0: every prompt does).
    assert _disagg_modes(cluster, ns, name).get(DISAGGREGATED, 0) >= 2


DISAGGREGATED = 'frota_router_disagg_requests_total{route="disaggregated"}'


def _disagg_modes(cluster: Cluster, ns: str, name: str) -> dict[str, float]:
    router = fleet.serving_pods(cluster, ns, name, "router")[0]
    return fleet.metrics(cluster, ns, router, fleet.ROUTER_PORT, "frota_router_disagg_")


def test_a_forged_kv_handle_sent_to_the_routers_service_never_reaches_a_worker(
        cluster: Cluster, ns: str, pd: str) -> None:
    """The attack as it was found: a client's own `x-frota-kv-handle`, pointed at an address
    of its choosing. The router drops it; the decode worker pulls only the fleet's own."""
    decode = fleet.serving_pods(cluster, ns, pd, "decode")[0]
    failures = "frota_kv_transfer_failures"
    before = fleet.metrics(cluster, ns, decode, fleet.WORKER_PORT, failures)
    served = _disagg_modes(cluster, ns, pd).get(DISAGGREGATED, 0)
    forged = json.dumps({"url": "http://kubernetes.default.svc", "id": "forged",
                         "fingerprint": "0" * 16, "prompt_digest": "0" * 16,
                         "num_prompt_tokens": 8, "first_token": 1, "adapter": None,
                         "expires_at": time.time() + 60, "sig": "0" * 64})
    with cluster.route_to_cluster_ip(ns, pd) as ip:
        client = openai.OpenAI(base_url=f"http://{ip}:{SERVICE_PORT}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
                temperature=0, extra_headers={InternalHeader.KV_HANDLE: forged})
        finally:
            client.close()
    assert raw.http_response.status_code == 200
    assert "paris" in raw.parse().choices[0].message.content.lower()
    assert InternalHeader.WORKER not in raw.headers and "x-request-id" in raw.headers
    # Served through the fleet's own handle, and the decode worker refused nothing: the
    # client's header never reached it.
    assert _disagg_modes(cluster, ns, pd).get(DISAGGREGATED, 0) == served + 1
    assert fleet.metrics(cluster, ns, decode, fleet.WORKER_PORT, failures) == before


def _pod_key(cluster: Cluster, ns: str, pod: str) -> str:
    return cluster.kubectl("exec", "-n", ns, pod, "--", "cat", FleetKey.FILE).strip()


def test_a_request_in_flight_survives_a_rotation_of_the_fleet_key(
        cluster: Cluster, ns: str, pd: str) -> None:
    """A stream runs while the Secret gets a new key; requests keep being served while the
    kubelet carries the key into each pod; once every pod has it, prompts go disaggregated
    again (the handles signed and checked under the new key)."""
    pods = [fleet.serving_pods(cluster, ns, pd, role)[0] for role in ("router", "prefill",
                                                                      "decode")]
    secret = pd + FleetKey.SECRET_SUFFIX
    old = base64.b64decode(cluster.get("secret", secret, ns)["data"][FleetKey.DATA_KEY]).decode()
    assert {_pod_key(cluster, ns, p) for p in pods} == {old}
    new = generate_key()
    served: list[str] = []
    with router_client(cluster, ns, pd) as client:
        stream = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=160,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        first = next(iter(stream))  # in flight: its KV is on the decode worker
        cluster.kubectl("patch", "secret", secret, "-n", ns, "-p",
                        json.dumps({"stringData": {FleetKey.DATA_KEY: new}}))
        chunks = [first, *stream]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert sum(len(c.choices[0].text) > 0 for c in chunks if c.choices) >= 100

        def everywhere() -> bool:
            served.append(chat(client, PROMPT, max_tokens=4))  # served all along
            return {_pod_key(cluster, ns, p) for p in pods} == {new}

        wait_until("the new key in every pod", everywhere, timeout=240, interval=2)
        before = _disagg_modes(cluster, ns, pd).get(DISAGGREGATED, 0)
        assert "paris" in chat(client, PROMPT).lower()
    assert all(served), served
    assert _disagg_modes(cluster, ns, pd).get(DISAGGREGATED, 0) == before + 1
