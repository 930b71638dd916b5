"""LoRA adapters on the cluster (issue 29): one adapter from an ``https://`` server inside
the cluster (TLS from a CA made at test time, given by ``spec.model.caBundle``), one more
loaded at run time through the router, requests routed by adapter name, unloading.

One Frota InferenceService serves the module and the tests run in file order: spec
adapter, runtime load, status, a second replica that gets both adapters, unload from both.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from e2e import fleet
from e2e.fleet import router_client, wait_ready
from e2e.kube import Cluster, wait_until

NAME = "lora"
PROMPT = "Write one sentence about the sea."


def ask(client: openai.OpenAI, model: str) -> str:
    """One greedy completion under ``model`` (the base model's name or an adapter's)."""
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0)
    return reply.choices[0].message.content or ""


def router_post(client: openai.OpenAI, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST to the router beside the openai client (the load/unload routes are not OpenAI's)."""
    return httpx.post(f"{client.base_url}{path}", json=body, timeout=120)


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str, adapter_server: Any) -> str:
    ca = adapter_server.install_ca(cluster, ns)
    body = fleet.small_isvc(NAME, adapters=[{"name": "sql", "uri": adapter_server.uri("sql")}])
    body["spec"]["model"]["caBundle"] = ca
    body["spec"]["engine"]["lora"] = {"maxAdapters": 2, "maxRank": 8, "allowRuntimeLoading": True}
    cluster.apply(body, namespace=ns)
    wait_ready(cluster, ns, NAME)
    return NAME


@pytest.fixture(scope="module")
def answers(cluster: Cluster, ns: str, isvc: str) -> dict[str, str]:
    """Greedy answers by model name, filled in as the tests go."""
    return {}


def test_the_https_adapter_is_fetched_with_the_ca_and_listed_with_its_parent(
    cluster: Cluster, ns: str, isvc: str, answers: dict[str, str]
) -> None:
    (pod,) = cluster.get("pods", namespace=ns, **{fleet.INSTANCE: isvc, fleet.ROLE: "worker"})
    fetches = [c for c in pod["spec"]["initContainers"] if c["name"].startswith("fetch-adapter")]
    assert fetches, [c["name"] for c in pod["spec"]["initContainers"]]
    env = {e["name"]: e.get("value") for e in fetches[0].get("env", [])}
    assert env.get("SSL_CERT_FILE") == "/etc/frota/ca/ca.crt", env
    with router_client(cluster, ns, isvc) as client:
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"smollm2", "sql"}, models
        assert getattr(models["sql"], "parent", None) == "smollm2", models["sql"]
        answers["smollm2"], answers["sql"] = ask(client, "smollm2"), ask(client, "sql")
    assert answers["sql"] != answers["smollm2"], answers


def test_an_adapter_loaded_through_the_router_from_https_serves(
    cluster: Cluster, ns: str, isvc: str, answers: dict[str, str], adapter_server: Any
) -> None:
    with router_client(cluster, ns, isvc) as client:
        reply = router_post(client, "load_lora_adapter",
                            {"lora_name": "tone", "lora_path": adapter_server.uri("tone")})
        assert reply.status_code == 200, reply.text
        ids = wait_until("tone in the router's model list", lambda: (
            ids := {m.id for m in client.models.list().data}) >= {"tone"} and ids, timeout=60)
        assert ids == {"smollm2", "sql", "tone"}, ids
        answers["tone"] = ask(client, "tone")
        # Greedy: each adapter gives its own answer, and the base model its own again.
        assert len({answers["smollm2"], answers["sql"], answers["tone"]}) == 3, answers
        assert ask(client, "smollm2") == answers["smollm2"]
        assert ask(client, "sql") == answers["sql"]


def test_status_shows_both_adapters_resident_on_the_replica(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    def resident() -> dict[str, Any] | None:
        adapters = {a["name"]: a for a in
                    cluster.get("inferenceservice", isvc, ns)["status"].get("adapters") or []}
        ok = all(adapters.get(n, {}).get("residentReplicas") == 1 for n in ("sql", "tone"))
        return adapters if ok else None

    adapters = wait_until("sql and tone resident in status.adapters", resident, timeout=90)
    assert adapters["sql"]["source"] == "spec" and adapters["tone"]["source"] == "runtime", adapters
    assert not any(a.get("lastError") for a in adapters.values()), adapters


def worker_models(cluster: Cluster, ns: str, pod: str) -> set[str]:
    """What one worker pod itself lists on /v1/models (not the router's union)."""
    with cluster.reach(ns, pod, fleet.WORKER_PORT) as (host, port):
        return {m["id"] for m in httpx.get(f"http://{host}:{port}/v1/models", timeout=30).json()["data"]}


def test_a_replica_started_later_serves_the_spec_and_the_runtime_adapter(
    cluster: Cluster, ns: str, isvc: str, answers: dict[str, str]
) -> None:
    (first,) = fleet.serving_pods(cluster, ns, isvc)
    cluster.kubectl("scale", "inferenceservice", isvc, "-n", ns, "--replicas", "2")
    wait_ready(cluster, ns, isvc)

    def two_serving() -> list[str] | None:
        pods = fleet.serving_pods(cluster, ns, isvc)
        return pods if len(pods) == 2 else None

    (new,) = set(wait_until("two serving workers", two_serving, timeout=300)) - {first}

    def both_adapters() -> set[str] | None:
        ids = worker_models(cluster, ns, new)
        return ids if ids >= {"sql", "tone"} else None

    # The spec's adapter comes with the pod; the runtime one, loaded before the pod existed,
    # is given to it by the router before it serves.
    assert wait_until("both adapters on the new worker", both_adapters, timeout=90) \
        == {"smollm2", "sql", "tone"}
    with cluster.reach(ns, new, fleet.WORKER_PORT) as (host, port):
        direct = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        assert ask(direct, "tone") == answers["tone"]  # greedy float32: the same adapter's answer
        assert ask(direct, "sql") == answers["sql"]

    def on_both() -> dict[str, Any] | None:
        adapters = {a["name"]: a for a in
                    cluster.get("inferenceservice", isvc, ns)["status"].get("adapters") or []}
        return adapters if all(adapters.get(n, {}).get("residentReplicas") == 2
                               for n in ("sql", "tone")) else None

    wait_until("sql and tone resident on both replicas in status.adapters", on_both, timeout=120)


def test_unloading_one_adapter_leaves_the_others_serving(
    cluster: Cluster, ns: str, isvc: str, answers: dict[str, str]
) -> None:
    with router_client(cluster, ns, isvc) as client:
        reply = router_post(client, "unload_lora_adapter", {"lora_name": "tone"})
        assert reply.status_code == 200, reply.text
        with pytest.raises(openai.NotFoundError) as refused:
            ask(client, "tone")
        # openai reads the code from the body's {"error": {...}}.
        assert refused.value.code == "model_not_found", refused.value.body
        assert {m.id for m in client.models.list().data} == {"smollm2", "sql"}
        assert ask(client, "sql") == answers["sql"]
        assert ask(client, "smollm2") == answers["smollm2"]
    # The unload reached every replica.
    for pod in fleet.serving_pods(cluster, ns, isvc):
        assert worker_models(cluster, ns, pod) == {"smollm2", "sql"}, pod
