"""Disaggregated and tensor-parallel fleets serve correct output through the router.

Each test skips with its reason while `frota worker --help` does not show the
flag the fleet needs (`--role prefill|decode`, `--tensor-parallel-size`).
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
from collections.abc import Iterator

import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until

PROMPT = "What is the capital of France? Answer in one word."
# SmolLM2 has 9 attention heads, which 2 does not divide: tensor parallel
# runs a seeded synthetic model, checked against the same model on one rank.
SYNTHETIC = "synthetic:dense-small"
SYNTHETIC_NAME = "dense-small"


@functools.cache
def _worker_help() -> str:
    return subprocess.run([sys.executable, "-m", "frota.cli.main", "worker", "--help"],
                          capture_output=True, text=True, timeout=60).stdout


def _needs(flag: str, *values: str) -> None:
    text = _worker_help()
    if flag not in text or not all(v in text.split(flag, 1)[1][:200] for v in values):
        pytest.skip(f"`frota worker --help` does not show {flag} {'|'.join(values)} yet")


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


def test_disaggregated_fleet_serves_through_prefill_and_decode(cluster: Cluster, ns: str) -> None:
    _needs("--role", "prefill", "decode")
    manifest = fleet.small_isvc(
        "pd", disaggregation={"minPromptTokens": 0, "prefill": {"replicas": 1},
                              "decode": {"replicas": 1}})
    with running(cluster, ns, manifest) as name:
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
        router = fleet.serving_pods(cluster, ns, name, "router")[0]
        modes = fleet.metrics(cluster, ns, router, fleet.ROUTER_PORT, "frota_router_disagg_")
        assert modes.get('frota_router_disagg_requests_total{route="disaggregated"}', 0) >= 2, modes


def test_tensor_parallel_two_pods_serve_what_one_rank_serves(cluster: Cluster, ns: str) -> None:
    _needs("--tensor-parallel-size")
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
