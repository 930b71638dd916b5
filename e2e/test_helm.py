"""charts/frota on a clean cluster: `helm install`, `helm upgrade` to a changed value, and
`helm uninstall`, which leaves no operator object behind and keeps the CRDs, as Helm does.
With two replicas, one is active and reconciles, and a standby takes over when it goes.

Runs first in the suite (e2e/conftest.py orders it), before any test installs the operator
with kustomize; the rest of the suite then installs it that way on the same cluster.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kube import Cluster, pod_is_ready, wait_until

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "frota"
RELEASE = "frota"
RELEASE_NS = "default"
# The chart creates the operator's namespace (restricted Pod Security), apart from the
# release's, and deletes it on uninstall; not frota-system, which the kustomize install uses.
OPERATOR_NS = "frota-helm"
VALUES = ["--set", f"namespaceOverride={OPERATOR_NS},namespace.create=true",
          "--set", "image.repository=frota-operator,image.tag=dev,replicaCount=2",
          "--set", "resources.requests.cpu=50m,resources.requests.memory=128Mi"]
CRDS = ("inferenceservices.frota.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
SELECTOR = {"app.kubernetes.io/name": "frota", "app.kubernetes.io/component": "operator"}
INSTANCE = "app.kubernetes.io/instance"


class Helm:
    """The helm binary of e2e/cluster/helm.sh, on the cluster under test."""

    def __init__(self, binary: str, kubeconfig: str) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    def __call__(self, *args: str) -> str:
        proc = subprocess.run([self.binary, "--kubeconfig", self.kubeconfig, *args],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout


@pytest.fixture(scope="module")
def helm(cluster: Cluster) -> Iterator[Helm]:
    # Cached: a second; on a fresh machine it builds Helm from its Go module (minutes).
    proc = subprocess.run(["bash", str(REPO / "e2e" / "cluster" / "helm.sh")],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.skip(f"no helm binary: e2e/cluster/helm.sh failed: {proc.stderr.strip()[-500:]}")
    if cluster.get("clusterroles", **SELECTOR):
        pytest.skip("the operator is installed already: the chart needs a clean cluster "
                    "(e2e/conftest.py runs this module first)")
    helm = Helm(proc.stdout.strip().splitlines()[-1], cluster.kubeconfig)
    yield helm
    # After a failure, leave the cluster to the suite's kustomize install.
    subprocess.run([helm.binary, "--kubeconfig", helm.kubeconfig, "uninstall", RELEASE,
                    "-n", RELEASE_NS, "--ignore-not-found", "--wait"],
                   capture_output=True, timeout=300)


def _deployment(cluster: Cluster) -> dict[str, Any]:
    return cluster.get("deployment", "frota-operator", OPERATOR_NS)


def _rolled_out(cluster: Cluster, generation: int) -> bool:
    """The Deployment's `generation` observed, every replica updated and available, no old pod left."""
    deploy = _deployment(cluster)
    status, want = deploy["status"], deploy["spec"]["replicas"]
    pods = [p for p in cluster.get("pods", namespace=OPERATOR_NS, **SELECTOR)
            if not p["metadata"].get("deletionTimestamp")]
    return (deploy["metadata"]["generation"] == generation
            and status.get("observedGeneration") == generation
            and status.get("updatedReplicas") == want and status.get("availableReplicas") == want
            and status.get("replicas") == want and len(pods) == want and all(map(pod_is_ready, pods)))


def _exists(cluster: Cluster, obj: dict[str, Any]) -> bool:
    kind = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}" if "/" in obj["apiVersion"] \
        else obj["kind"].lower()
    ns = obj["metadata"].get("namespace")
    out = cluster.kubectl("get", kind, obj["metadata"]["name"], *(["-n", ns] if ns else []),
                          "--ignore-not-found", "-o", "name")
    return bool(out.strip())


def _isvc(name: str, namespace: str) -> dict[str, Any]:
    """An InferenceService whose worker pods stay Pending: what is judged is the operator."""
    return {"apiVersion": "frota.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "smollm2", "uri": "alias:smollm2"},
                     "resources": {"cpu": "1", "memory": "3Gi"},
                     "placement": {"nodeSelector": {"frota.dev/e2e": "nowhere"}}}}


def _reconciled(cluster: Cluster, namespace: str, name: str) -> bool:
    return bool(cluster.get("statefulsets", namespace=namespace, **{INSTANCE: name}))


def _peers(cluster: Cluster) -> dict[str, int]:
    """kopf's live peers (identity: user@pod-name/...) and their priorities."""
    status = cluster.get("clusterkopfpeering", "frota").get("status") or {}
    return {identity: peer["priority"] for identity, peer in status.items()}


def _check_one_replica_active_and_handing_over(cluster: Cluster, namespace: str) -> None:
    # The two replicas share their flags; kopf pauses every peer that ties on priority, so
    # with its default of 0 for both nothing was ever reconciled.
    cluster.apply(_isvc("peered", namespace), namespace=namespace)
    wait_until("the active operator replica to reconcile an InferenceService",
               lambda: _reconciled(cluster, namespace, "peered"), timeout=90)
    wait_until("both replicas in the peering object", lambda: len(_peers(cluster)) == 2, timeout=60)
    peers = _peers(cluster)
    assert len(set(peers.values())) == 2, f"the replicas tie on priority: {peers}"
    # Delete the active replica (the highest priority): the other takes over.
    active = max(peers, key=peers.__getitem__)
    (pod,) = [p["metadata"]["name"] for p in cluster.get("pods", namespace=OPERATOR_NS, **SELECTOR)
              if f"@{p['metadata']['name']}" in active]
    cluster.kubectl("delete", "pod", pod, "-n", OPERATOR_NS, "--wait=false")
    cluster.apply(_isvc("handed-over", namespace), namespace=namespace)
    wait_until("a standby replica to take over and reconcile a new InferenceService",
               lambda: _reconciled(cluster, namespace, "handed-over"), timeout=150)
    cluster.kubectl("delete", "inferenceservices", "--all", "-n", namespace, "--wait=true",
                    "--timeout=90s")


def test_chart_installs_upgrades_and_uninstalls_the_operator(cluster: Cluster, helm: Helm,
                                                             namespace: str) -> None:
    helm("install", RELEASE, str(CHART), "-n", RELEASE_NS, *VALUES)
    cluster.wait_crds_established(list(CRDS))
    wait_until("the chart's operator Deployment to roll out (2 replicas, Available)",
               lambda: _rolled_out(cluster, 1), timeout=180)
    _check_one_replica_active_and_handing_over(cluster, namespace)
    wait_until("the Deployment's replacement pod", lambda: _rolled_out(cluster, 1), timeout=180)
    namespace = cluster.get("namespace", OPERATOR_NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert cluster.get("poddisruptionbudget", "frota-operator", OPERATOR_NS)["spec"]["minAvailable"] == 1
    manifest = [d for d in yaml.safe_load_all(helm("get", "manifest", RELEASE, "-n", RELEASE_NS)) if d]
    assert {o["kind"] for o in manifest} >= {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                             "Role", "RoleBinding", "Service", "Deployment",
                                             "PodDisruptionBudget"}

    # A changed value rolls the Deployment: debug logs, and an annotation on the pods.
    helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NS, *VALUES,
         "--set", "logLevel=debug", "--set-string", "podAnnotations.e2e/revision=2")
    wait_until("the upgraded operator Deployment to roll out", lambda: _rolled_out(cluster, 2), timeout=240)
    for pod in cluster.get("pods", namespace=OPERATOR_NS, **SELECTOR):
        assert pod["metadata"]["annotations"]["e2e/revision"] == "2"
        assert "--verbose" in pod["spec"]["containers"][0]["args"]
    status = json.loads(helm("status", RELEASE, "-n", RELEASE_NS, "-o", "json"))
    assert (status["version"], status["info"]["status"]) == (2, "deployed")

    helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait")
    left = [f"{o['kind']}/{o['metadata']['name']}" for o in manifest if _exists(cluster, o)]
    # The namespace may still be terminating: then it must be empty of the operator's pods.
    if left == ["Namespace/" + OPERATOR_NS]:
        assert cluster.get("namespace", OPERATOR_NS)["status"]["phase"] == "Terminating"
        wait_until("the operator's pods to be gone",
                   lambda: not cluster.get("pods", namespace=OPERATOR_NS, **SELECTOR), timeout=120)
        left = []
    assert not left, f"helm uninstall left {left}"
    assert not cluster.get("clusterroles", **SELECTOR)
    # Helm never deletes what crds/ installed: the InferenceServices outlive the release.
    for crd in CRDS:
        assert cluster.get("crd", crd)["metadata"]["name"] == crd
