"""The operator against a real control plane: children, status, scale, drift, invalid spec, GC.

The operator runs as a local process (`frota operator -n NS --standalone`)
with the cluster's kubeconfig. Worker pods are pinned to a node that does not
exist, so they stay Pending: what is tested is the operator and the real
controllers around it (StatefulSet, garbage collector), not the engine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kube import Cluster, wait_until

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "frota.dev_inferenceservices.yaml"
INSTANCE = "app.kubernetes.io/instance"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_cluster_operator_available(cluster: Cluster) -> bool:
    out = cluster.kubectl("get", "deployment", "frota-operator", "-n", "frota-system",
                          "-o", "json", check=False)
    return bool(out) and json.loads(out).get("status", {}).get("availableReplicas", 0) > 0


@pytest.fixture
def operator(cluster: Cluster, namespace: str) -> Iterator[subprocess.Popen[bytes] | None]:
    """The CRD installed, and `frota operator` watching the test's namespace."""
    cluster.kubectl("apply", "--server-side", "--field-manager=frota-e2e", "-f", str(CRD))
    cluster.wait_crds_established(["inferenceservices.frota.dev"])
    if _in_cluster_operator_available(cluster):
        # test_operator_install left the operator running in the cluster (all
        # namespaces): test that one rather than run a second beside it.
        yield None
        return
    port = _free_port()
    with tempfile.NamedTemporaryFile("w+", prefix="frota-operator-", suffix=".log") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "frota.cli.main", "operator", "--namespace", namespace,
             "--standalone", "--metrics-port", "0",
             "--liveness", f"http://127.0.0.1:{port}/healthz"],
            env={**os.environ, "KUBECONFIG": cluster.kubeconfig}, stdout=log,
            stderr=subprocess.STDOUT, cwd=REPO,
        )

        def healthy() -> bool:
            assert proc.poll() is None, "the operator exited"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return True

        try:
            wait_until("the operator's /healthz", healthy, timeout=60)
            yield proc
        except BaseException:
            log.seek(0)
            print(log.read()[-5000:])
            raise
        finally:
            proc.terminate()
            proc.wait(15)


def _isvc(name: str, namespace: str, replicas: int) -> dict:
    return {
        "apiVersion": "frota.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "smollm2", "uri": "alias:smollm2"},
            "engine": {"dtype": "float32", "maxModelLen": 2048},
            "resources": {"cpu": "1", "memory": "3Gi"},
            "replicas": replicas,
            "placement": {"nodeSelector": {"frota.dev/e2e": "nowhere"}},
        },
    }


def _groups(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return sorted(s["metadata"]["name"]
                  for s in cluster.get("statefulsets", namespace=namespace, **{INSTANCE: name}))


def _condition(cluster: Cluster, namespace: str, name: str, type_: str) -> dict | None:
    status = cluster.get("inferenceservice", name, namespace).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def test_operator_converges_scales_repairs_and_is_garbage_collected(
    cluster: Cluster, namespace: str, operator: subprocess.Popen[bytes] | None
) -> None:
    name = "tiny"
    cluster.apply(_isvc(name, namespace, replicas=2), namespace=namespace)
    wait_until("both groups", lambda: _groups(cluster, namespace, name)
               == ["tiny-worker-0", "tiny-worker-1"], timeout=60)
    # The StatefulSet controller made the rank pods; they cannot schedule, and
    # status says so: not Ready, generation observed, the spec valid.
    wait_until("rank pods", lambda: len(cluster.get("pods", namespace=namespace,
                                                    **{"frota.dev/role": "worker"})) == 2)
    wait_until("status", lambda: _condition(cluster, namespace, name, "SpecValid"), timeout=30)
    isvc = cluster.get("inferenceservice", name, namespace)
    assert isvc["status"]["observedGeneration"] == isvc["metadata"]["generation"]
    assert _condition(cluster, namespace, name, "Ready")["status"] == "False"
    assert isvc["status"]["readyReplicas"] == 0
    sts = json.loads(cluster.kubectl("get", "statefulset", "tiny-worker-0", "-n", namespace,
                                     "--show-managed-fields", "-o", "json"))
    assert ("frota-operator", "Apply") in {
        (m["manager"], m["operation"]) for m in sts["metadata"]["managedFields"]}
    assert sts["spec"]["updateStrategy"]["type"] == "OnDelete"

    # The scale subresource adds whole groups.
    cluster.kubectl("scale", "inferenceservice", name, "-n", namespace, "--replicas", "3")
    wait_until("3 groups", lambda: len(_groups(cluster, namespace, name)) == 3, timeout=60)

    # A deleted child comes back.
    cluster.kubectl("delete", "statefulset", "tiny-worker-1", "-n", namespace, "--wait=false")
    wait_until("the group back", lambda: "tiny-worker-1" in _groups(cluster, namespace, name)
               and not cluster.get("statefulset", "tiny-worker-1", namespace)["metadata"]
               .get("deletionTimestamp"), timeout=60)

    # An invalid spec is reported with its field and changes nothing.
    cluster.kubectl("patch", "inferenceservice", name, "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"engine": {"maxModelLen": 999999}}}')
    wait_until("SpecValid=False", lambda: _condition(cluster, namespace, name, "SpecValid")
               ["status"] == "False", timeout=30)
    assert "engine.maxModelLen" in _condition(cluster, namespace, name, "SpecValid")["message"]
    assert len(_groups(cluster, namespace, name)) == 3

    # Deleting the InferenceService (foreground: children first) lets the
    # garbage collector take every child, and the operator does not fight it.
    cluster.kubectl("delete", "inferenceservice", name, "-n", namespace,
                    "--cascade=foreground", "--wait=false")
    for kind in ("statefulsets", "services", "deployments", "configmaps", "roles"):
        wait_until(f"{kind} collected", lambda kind=kind: not cluster.get(
            kind, namespace=namespace, **{INSTANCE: name}), timeout=90)
    wait_until("the InferenceService gone", lambda: not cluster.get(
        "inferenceservices", namespace=namespace), timeout=90)


def _mark_ready(cluster: Cluster, namespace: str, selector: dict[str, str]) -> int:
    """Be the kubelet: mark the selected live pods Running and Ready (they never schedule)."""
    marked = 0
    for pod in cluster.get("pods", namespace=namespace, **selector):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", [])):
            continue
        status = {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]}}
        cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace,
                        "--subresource=status", "--type=merge", "-p", json.dumps(status))
        marked += 1
    return marked


def _all_groups_serve(cluster: Cluster, namespace: str, name: str) -> bool:
    """Every group serves the current revision, and Ready tells the rest of the truth.

    Pods the test marks ready have no IP and no node, so no EndpointSlice lists
    them: the router could not reach them, and Ready must say so
    (EndpointsPending) rather than turn True.
    """
    isvc = cluster.get("inferenceservice", name, namespace)
    status = isvc.get("status") or {}
    wanted = isvc["spec"]["replicas"]
    roles = status.get("roles") or []
    if status.get("observedGeneration") != isvc["metadata"]["generation"] or not roles:
        return False
    if any(r["readyReplicas"] != wanted or r["updatedReplicas"] != wanted for r in roles):
        return False
    cond = _condition(cluster, namespace, name, "Ready") or {}
    assert (cond.get("status"), cond.get("reason")) in {
        ("True", "AllReplicasReady"), ("False", "EndpointsPending")}, cond
    return True


def _revisions(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["labels"]["frota.dev/revision"]
            for s in cluster.get("statefulsets", namespace=namespace, **{INSTANCE: name})}


def test_rollout_replaces_one_whole_group_at_a_time(
    cluster: Cluster, namespace: str, operator: subprocess.Popen[bytes] | None
) -> None:
    name = "roll"
    manifest = _isvc(name, namespace, replicas=2)
    manifest["spec"]["rollout"] = {"maxUnavailable": 1, "maxSurge": 0}
    cluster.apply(manifest, namespace=namespace)
    wait_until("both groups", lambda: len(_groups(cluster, namespace, name)) == 2, timeout=60)

    def ready() -> bool:
        _mark_ready(cluster, namespace, {INSTANCE: name})
        return _all_groups_serve(cluster, namespace, name)

    wait_until("every group serving", ready, timeout=90)
    old = set(_revisions(cluster, namespace, name).values())

    cluster.kubectl("patch", "inferenceservice", name, "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"engine": {"maxModelLen": 1024}}}')
    replaced: list[str] = []
    for _ in range(2):
        def next_group() -> str | None:
            new = sorted(g for g, r in _revisions(cluster, namespace, name).items() if r not in old)
            return new[len(replaced)] if len(new) == len(replaced) + 1 else None

        group = wait_until("the next group on the new revision", next_group, timeout=60)
        # The other group keeps serving on its old revision meanwhile.
        assert len([g for g, r in _revisions(cluster, namespace, name).items()
                    if r in old]) == 1 - len(replaced)
        # The StatefulSet controller recreates the group's ranks from the new template.
        new_rev = _revisions(cluster, namespace, name)[group]
        wait_until("the group's pods at the new revision", lambda g=group, r=new_rev: [
            p for p in cluster.get("pods", namespace=namespace,
                                   **{"frota.dev/replica": g.rsplit("-", 1)[1], INSTANCE: name})
            if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["labels"]["frota.dev/revision"] == r], timeout=60)
        replaced.append(group)
        _mark_ready(cluster, namespace, {INSTANCE: name, "frota.dev/replica": group[-1]})
    assert replaced == ["roll-worker-0", "roll-worker-1"]
    wait_until("every group serving the new revision", ready, timeout=90)
    status = cluster.get("inferenceservice", name, namespace)["status"]
    assert status["revision"] not in old


def test_a_rank_that_restarted_takes_its_whole_group_down_and_back(
    cluster: Cluster, namespace: str, operator: subprocess.Popen[bytes] | None
) -> None:
    name = "heal"
    manifest = _isvc(name, namespace, replicas=1)
    manifest["spec"]["parallelism"] = {"pipeline": 2}
    cluster.apply(manifest, namespace=namespace)

    def ready() -> bool:
        _mark_ready(cluster, namespace, {INSTANCE: name})
        return _all_groups_serve(cluster, namespace, name)

    wait_until("every group serving", ready, timeout=90)
    pods = cluster.get("pods", namespace=namespace, **{"frota.dev/role": "worker", INSTANCE: name})
    assert len(pods) == 2
    uids = {p["metadata"]["uid"] for p in pods}
    crashed = {"status": {"containerStatuses": [{
        "name": "worker", "image": "frota-worker:e2e", "imageID": "", "ready": False,
        "restartCount": 1, "state": {"running": {}}}]}}
    cluster.kubectl("patch", "pod", "heal-worker-0-1", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(crashed))
    # Both ranks are replaced, not just the one that restarted.
    wait_until("both ranks recreated", lambda: not uids & {
        p["metadata"]["uid"] for p in cluster.get(
            "pods", namespace=namespace, **{"frota.dev/role": "worker", INSTANCE: name})},
        timeout=60)
    # kopf posts events from a queue of its own, so the event may trail the restart.
    wait_until("a GroupRestarted event", lambda: any(
        e["reason"] == "GroupRestarted" for e in cluster.get("events", namespace=namespace)),
        timeout=30)
    wait_until("every group serving again", ready, timeout=90)
