"""Fixtures of the e2e suite: a cluster (local control plane or given) and a namespace.

``FROTA_E2E_KUBECONFIG`` set: the tests run against that cluster (kind), with
``FROTA_E2E_ADDRESS`` (default ``port-forward``) saying how to reach pods and
``FROTA_E2E_IMAGE`` the image pods declare. Unset: a local control plane is
started for the session (``FROTA_E2E_NODES`` nodes, default 2, each
with ``FROTA_E2E_GPUS`` fake GPUs, default 2) from the cached binaries (``e2e/cluster/build.sh``;
``FROTA_E2E_BUILD=1`` builds them when missing) and stopped afterwards, also
after a failure.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kube import Cluster, wait_until

pytestmark = pytest.mark.e2e


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark everything under e2e/ as e2e."""
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster under test, started here when no kubeconfig is given."""
    given = os.environ.get("FROTA_E2E_KUBECONFIG")
    if given:
        yield Cluster(
            kubeconfig=given,
            kubectl_path=shutil.which("kubectl") or "kubectl",
            address=os.environ.get("FROTA_E2E_ADDRESS", "port-forward"),
            image=os.environ.get("FROTA_E2E_IMAGE", "frota-worker:e2e"),
        )
        return
    from e2e.cluster import ClusterOptions, LocalCluster, build_binaries, find_binaries
    from e2e.cluster.netns import ensure_host_tools, unavailable_reason

    ensure_host_tools()
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"local control plane unavailable: {reason}")
    bin_dir = find_binaries()
    if bin_dir is None:
        if os.environ.get("FROTA_E2E_BUILD") != "1":
            pytest.skip("control-plane binaries not built: run e2e/cluster/build.sh "
                        "(or set FROTA_E2E_BUILD=1)")
        bin_dir = build_binaries()
    options = ClusterOptions(
        nodes=int(os.environ.get("FROTA_E2E_NODES", "2")),
        gpus_per_node=int(os.environ.get("FROTA_E2E_GPUS", "2")),
    )
    with LocalCluster(bin_dir, options) as local:
        yield Cluster(
            kubeconfig=str(local.kubeconfig),
            kubectl_path=str(Path(bin_dir) / "kubectl"),
            address="pod-ip",
            image=os.environ.get("FROTA_E2E_IMAGE", "frota-worker:e2e"),
        )


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the controller has made the namespace's default account.
    wait_until("the default service account", lambda: cluster.get("serviceaccount", "default", name))
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
