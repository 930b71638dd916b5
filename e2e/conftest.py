"""Fixtures of the e2e suite: the kind cluster under test and restricted namespaces.

``e2e/kind/test.sh`` makes the cluster (a node image built here, the project's
own images loaded into it, the operator installed with ``kubectl apply -k``)
and runs this suite with ``FROTA_E2E_KUBECONFIG`` pointing at it. Without that
variable every e2e test skips, saying how to run them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import fleet
from e2e.kube import Cluster, make_namespace

# The strict-skip rule: under CI or scripts/test.sh, a skip for what scripts/test.sh provides
# (helm, promtool, Docker, the images, the cluster) fails instead.

pytestmark = pytest.mark.e2e


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything under e2e/ as e2e; run test_helm.py first, while no test has installed
    the operator with kustomize (the chart needs a clean cluster)."""
    for item in items:
        item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: item.path.name != "test_helm.py")  # stable: the rest keep their order


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The kind cluster made by ``e2e/kind/test.sh``."""
    kubeconfig = os.environ.get("FROTA_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.skip("no cluster given: run e2e/kind/test.sh (it builds the images and the kind "
                    "node image, creates the cluster and sets FROTA_E2E_KUBECONFIG)")
    return Cluster(
        kubeconfig=kubeconfig,
        kubectl_path=os.environ.get("FROTA_E2E_KUBECTL") or shutil.which("kubectl") or "kubectl",
        image=os.environ.get("FROTA_E2E_IMAGE", "frota-worker:dev"),
        kind_cluster=os.environ.get("KIND_CLUSTER", "frota-e2e"),
    )


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh restricted namespace, deleted (without waiting) after the test."""
    name = make_namespace(cluster)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def ns(cluster: Cluster) -> Iterator[str]:
    """A restricted namespace for a whole module, with the operator installed in the cluster."""
    fleet.install_operator(cluster)
    with fleet.fresh_namespace(cluster) as name:
        yield name


@pytest.fixture(scope="session")
def adapter_server(cluster: Cluster) -> Iterator[Any]:
    """The in-cluster HTTPS server of LoRA adapters (e2e/adapter_server.py), in its own
    namespace, shared by every module that serves adapters."""
    # Imported here: it needs torch, which the other e2e modules do not.
    from e2e import adapter_server as adapter_server_mod

    with fleet.fresh_namespace(cluster) as name:
        yield adapter_server_mod.start(cluster, name)
