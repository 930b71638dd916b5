"""The operator installs from manifests/ and comes up against a real apiserver."""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.kube import Cluster, wait_until

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
# The overlay the e2e suite installs: it runs the frota-operator:dev image e2e/kind/up.sh loads.
OVERLAY = MANIFESTS / "overlays" / "dev"


def test_operator_manifests_install_and_the_operator_becomes_available(cluster: Cluster) -> None:
    overlay = OVERLAY
    rendered = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(overlay))) if d]
    # One step on a fresh cluster: the manifests hold no custom resource that
    # would need its CRD established first (the operator makes its peering object).
    cluster.kubectl("apply", "--server-side", "--field-manager=frota-e2e", "-k", str(overlay))
    deployments = [d for d in rendered if d["kind"] == "Deployment"]
    assert deployments, "the manifests hold no operator Deployment"
    for dep in deployments:
        name, ns = dep["metadata"]["name"], dep["metadata"]["namespace"]
        wait_until(
            f"Deployment {ns}/{name} to become Available",
            lambda name=name, ns=ns: any(
                c["type"] == "Available" and c["status"] == "True"
                for c in cluster.get("deployment", name, ns)["status"].get("conditions", [])
            ),
            timeout=120,
        )
