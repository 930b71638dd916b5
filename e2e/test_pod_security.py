"""Every pod Frota renders is admitted under the `restricted` Pod Security level.

The apiserver's own admission decides: each pod template (operator, router,
workers of every sample) is created as a Pod with ``--dry-run=server`` in a
namespace that enforces `restricted`, so nothing is scheduled or started.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kube import Cluster, restricted

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted((REPO / "manifests" / "samples").glob("*.yaml"))
POD_OWNERS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def _pods_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Pod per pod template, named after its owner."""
    pods = []
    for obj in objects:
        if obj.get("kind") not in POD_OWNERS:
            continue
        template = obj["spec"]["template"]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": obj["metadata"]["name"].lower()[:63],
                                  "labels": template.get("metadata", {}).get("labels", {})},
                     "spec": template["spec"]})
    return pods


def _admit(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    # The ServiceAccount admission plugin refuses a pod whose account does not exist.
    account = pod["spec"].get("serviceAccountName")
    if account:
        cluster.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": account}}, namespace=namespace)
    return subprocess.run(
        [cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, "create", "--dry-run=server",
         "-n", namespace, "-f", "-"], input=yaml.safe_dump(pod), capture_output=True, text=True,
        timeout=60)


def _rendered(sample: Path) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "frota.cli.main", "render", str(sample)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_every_pod_of_a_sample_is_admitted_as_restricted(
    cluster: Cluster, namespace: str, sample: Path
) -> None:
    pods = _pods_of(_rendered(sample))
    roles = {p["metadata"]["labels"].get("frota.dev/role") for p in pods}
    assert "router" in roles and roles & {"worker", "prefill", "decode"}, roles
    for pod in pods:
        proc = _admit(cluster, namespace, pod)
        assert proc.returncode == 0, f"{sample.name}: {pod['metadata']['name']}: {proc.stderr}"
        # A pod that would only pass under a lower level gets a warning on stderr.
        assert "violate" not in proc.stderr, proc.stderr


def test_the_operator_pod_is_admitted_as_restricted(cluster: Cluster, namespace: str) -> None:
    rendered = [d for d in yaml.safe_load_all(cluster.kubectl(
        "kustomize", str(REPO / "manifests" / "overlays" / "dev"))) if d]
    (pod,) = _pods_of(rendered)
    proc = _admit(cluster, namespace, pod)
    assert proc.returncode == 0, proc.stderr


def test_the_restricted_level_is_enforced(cluster: Cluster, namespace: str) -> None:
    # What makes the admissions above mean something: a pod asking for root is refused.
    pod = restricted({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
                      "spec": {"containers": [{"name": "c", "image": cluster.image}]}})
    pod["spec"]["securityContext"]["runAsNonRoot"] = False
    pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
    proc = _admit(cluster, namespace, pod)
    assert proc.returncode != 0 and "restricted" in proc.stderr, proc.stderr
