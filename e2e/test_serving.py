"""A real fleet: the installed operator turns an InferenceService into worker pods that serve SmolLM2.

One InferenceService serves the whole module (a model load is 15-50 s on the
CI machine), and the tests run in file order: serve, repair, operator restart,
scale, roll, invalid spec, delete. Each leaves it Ready for the next.
"""

from __future__ import annotations

import time

import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until

NAME = "chat"
PROMPT = "What is the capital of France? Answer in one word."


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str) -> str:
    """The InferenceService of the module, Ready: one replica, surge-only rollouts."""
    cluster.apply(fleet.small_isvc(NAME, rollout={"maxUnavailable": 0, "maxSurge": 1}),
                  namespace=ns)
    wait_ready(cluster, ns, NAME)
    return NAME


@pytest.fixture(scope="module")
def short_answer(cluster: Cluster, ns: str, isvc: str) -> str:
    """The greedy first 4 tokens of the answer: what every later check expects again."""
    with router_client(cluster, ns, isvc) as client:
        return chat(client, PROMPT, max_tokens=4)


def test_operator_runs_with_no_more_rights_than_its_cluster_role(cluster: Cluster, ns: str) -> None:
    pod = fleet.operator_pod(cluster)
    assert pod["spec"]["serviceAccountName"] == "frota-operator"
    # No kubeconfig is given to the pod: the mounted token is its only credential.
    (container,) = pod["spec"]["containers"]
    assert "KUBECONFIG" not in {e["name"] for e in container.get("env", [])}
    assert pod["spec"].get("automountServiceAccountToken", True)
    # It created its peering object, and keeps its own entry in it alive.
    peering = wait_until("the operator in its peering", lambda: (
        p := cluster.get("clusterkopfpeering", "frota")).get("status") and p)
    assert peering["status"]
    for verb, resource in [("create", "statefulsets.apps"), ("delete", "pods"),
                           ("patch", "inferenceservices.frota.dev/status"),
                           ("create", "clusterkopfpeerings.kopf.dev")]:
        assert fleet.can_i(cluster, verb, resource, ns), f"{verb} {resource}"
    for verb, resource in [("get", "secrets"), ("create", "pods"), ("delete", "namespaces"),
                           ("create", "clusterroles.rbac.authorization.k8s.io"),
                           ("update", "customresourcedefinitions.apiextensions.k8s.io"),
                           ("delete", "inferenceservices.frota.dev")]:
        assert not fleet.can_i(cluster, verb, resource, ns), f"{verb} {resource}"


def test_inferenceservice_becomes_ready_and_serves_chat_and_streams(
    cluster: Cluster, ns: str, isvc: str, short_answer: str
) -> None:
    workers = cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
    assert [p["metadata"]["name"] for p in workers] == ["chat-worker-0-0"]
    status = cluster.get("inferenceservice", isvc, ns)["status"]
    assert status["readyReplicas"] == 1
    with router_client(cluster, ns, isvc) as client:
        answer = fleet.check_chat_stream_and_completion(client, PROMPT)
    assert answer.startswith(short_answer), (answer, short_answer)


def test_a_deleted_worker_pod_is_replaced_and_traffic_resumes(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    old = cluster.get("pod", "chat-worker-0-0", ns)["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "chat-worker-0-0", "-n", ns, "--wait=false")
    wait_until("a new worker pod", lambda: (
        p := cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"}))
        and p[0]["metadata"]["uid"] != old, timeout=90)
    wait_ready(cluster, ns, isvc)
    with router_client(cluster, ns, isvc) as client:
        answer = wait_until("the router to serve again", lambda: chat(client, PROMPT), timeout=60)
    assert "paris" in answer.lower(), answer


def test_restarting_the_operator_changes_nothing(cluster: Cluster, ns: str, isvc: str) -> None:
    before = fleet.resource_versions(cluster, ns, isvc)
    pods = {k for k in before if k.startswith("Pod/")}
    children = {k: v for k, v in before.items() if not k.startswith("Pod/")}
    old = fleet.operator_pod(cluster)["metadata"]["name"]
    cluster.kubectl("delete", "pod", old, "-n", fleet.OPERATOR_NS, "--wait=false")

    def new_operator_resumed() -> bool:
        # kopf resumes every existing object on start: one reconcile done, none pending.
        pod = fleet.operator_pod(cluster)["metadata"]["name"]
        if pod == old:
            return False
        seen = fleet.metrics(cluster, fleet.OPERATOR_NS, pod, fleet.OPERATOR_METRICS_PORT,
                             "frota_operator_")
        done = sum(v for k, v in seen.items() if k.startswith("frota_operator_reconciles_total"))
        return done >= 1 and seen.get("frota_operator_pending_reconciles") == 0

    wait_until("a new operator to resume the InferenceService", new_operator_resumed, timeout=120)
    wait_ready(cluster, ns, isvc, timeout=30)
    after = fleet.resource_versions(cluster, ns, isvc)
    assert {k for k in after if k.startswith("Pod/")} == pods
    assert {k: v for k, v in after.items() if not k.startswith("Pod/")} == children


def test_kubectl_scale_adds_and_removes_replica_groups(cluster: Cluster, ns: str, isvc: str) -> None:
    cluster.kubectl("scale", "inferenceservice", isvc, "-n", ns, "--replicas", "2")
    wait_until("two groups", lambda: fleet.groups(cluster, ns, isvc)
               == ["chat-worker-0", "chat-worker-1"], timeout=60)
    wait_ready(cluster, ns, isvc)
    assert cluster.get("inferenceservice", isvc, ns)["status"]["readyReplicas"] == 2
    assert len(fleet.serving_pods(cluster, ns, isvc)) == 2
    cluster.kubectl("scale", "inferenceservice", isvc, "-n", ns, "--replicas", "1")
    wait_until("one group", lambda: fleet.groups(cluster, ns, isvc) == ["chat-worker-0"],
               timeout=60)
    wait_until("one worker pod", lambda: len(cluster.get(
        "pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})) == 1, timeout=90)
    wait_ready(cluster, ns, isvc)


def test_a_spec_change_rolls_without_dropping_below_capacity(
    cluster: Cluster, ns: str, isvc: str, short_answer: str
) -> None:
    old = cluster.get("inferenceservice", isvc, ns)["status"]["revision"]
    cluster.kubectl("patch", "inferenceservice", isvc, "-n", ns, "--type=merge",
                    "-p", '{"spec": {"engine": {"scheduler": {"maxNumSeqs": 3}}}}')

    def rolled() -> bool:
        status = cluster.get("inferenceservice", isvc, ns)["status"]
        return status.get("revision") != old and fleet.condition(
            cluster, ns, isvc, "Ready").get("status") == "True" and len(
            cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})) == 1

    served = 0
    deadline = time.monotonic() + fleet.MODEL_TIMEOUT
    with router_client(cluster, ns, isvc) as client:
        try:
            # maxUnavailable 0: a worker serves and the router answers throughout
            # (each request, a few seconds here, paces the loop).
            while not rolled():
                assert time.monotonic() < deadline, "the rollout did not finish"
                assert fleet.serving_pods(cluster, ns, isvc), "no worker serving during the rollout"
                assert chat(client, PROMPT, max_tokens=4) == short_answer
                served += 1
        except AssertionError:
            print(fleet.describe(cluster, ns, isvc))
            raise
    assert served > 1
    sts = cluster.get("statefulsets", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
    assert [s["metadata"]["labels"]["frota.dev/revision"] for s in sts] == [
        cluster.get("inferenceservice", isvc, ns)["status"]["revision"]]


def test_an_invalid_semantic_spec_is_reported_and_changes_nothing(
    cluster: Cluster, ns: str, isvc: str, short_answer: str
) -> None:
    before = {k: v for k, v in fleet.resource_versions(cluster, ns, isvc).items()
              if not k.startswith("Pod/")}
    # Accepted by the schema, refused by the semantic check: no sequence fits.
    cluster.kubectl("patch", "inferenceservice", isvc, "-n", ns, "--type=merge",
                    "-p", '{"spec": {"engine": {"maxModelLen": 999999}}}')
    cond = wait_until("SpecValid=False", lambda: (
        c := fleet.condition(cluster, ns, isvc, "SpecValid")).get("status") == "False" and c,
        timeout=30)
    assert "engine.maxModelLen" in cond["message"], cond
    after = {k: v for k, v in fleet.resource_versions(cluster, ns, isvc).items()
             if not k.startswith("Pod/")}
    assert after == before
    with router_client(cluster, ns, isvc) as client:
        assert chat(client, PROMPT, max_tokens=4) == short_answer


def test_deleting_the_inferenceservice_collects_every_child(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    assert fleet.resource_versions(cluster, ns, isvc)
    cluster.kubectl("delete", "inferenceservice", isvc, "-n", ns, "--wait=false")
    wait_until("every child collected", lambda: not fleet.resource_versions(cluster, ns, isvc),
               timeout=120)
    wait_until("the InferenceService gone",
               lambda: not cluster.get("inferenceservices", namespace=ns), timeout=60)
