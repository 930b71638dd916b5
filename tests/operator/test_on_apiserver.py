"""The CRD, samples, operator RBAC and rendered children against a real kube-apiserver.

Runs when the e2e suite's Kubernetes binaries are cached (etcd, kube-apiserver,
kubectl; e2e/cluster/build.sh); skipped otherwise. Only etcd and the apiserver start:
no scheduler or nodes, so nothing runs, but everything is admitted (or refused)
exactly as in a cluster, with RBAC enforced.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.apiserver import apiserver, find_binaries

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
OPERATOR = "system:serviceaccount:frota-system:frota-operator"


class Kubectl:
    """kubectl against the throwaway apiserver."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([str(self.binary), f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                             capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory) -> Iterator[Kubectl]:
    bins = find_binaries()
    if bins is None:
        pytest.skip("no cached Kubernetes binaries (build them with e2e/cluster/build.sh)")
    with apiserver(bins, tmp_path_factory.mktemp("apiserver")) as kubeconfig:
        k = Kubectl(bins / "kubectl", kubeconfig)
        # The operator's install, as a user would: CRDs first, then everything.
        overlay = str(ROOT / "manifests" / "overlays" / "production")
        k("apply", "--server-side", "-k", overlay, check=False)
        k("wait", "--for=condition=Established", "crd/inferenceservices.frota.dev", "--timeout=60s")
        k("apply", "--server-side", "-k", overlay)
        k("create", "namespace", "llm")
        yield k


@pytest.mark.slow
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_apiserver_accepts_every_sample(kubectl, path):
    kubectl("apply", "-n", "llm", "--dry-run=server", "-f", str(path))


@pytest.mark.slow
def test_apiserver_rejects_each_bad_spec_with_its_message(kubectl):
    from tests.api.test_crd import BAD_SPECS

    for case, (obj, fragment) in BAD_SPECS.items():
        out = kubectl("apply", "-n", "llm", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(obj), check=False)
        assert out.returncode != 0, f"{case} was admitted"
        assert fragment in out.stderr, f"{case}: {out.stderr}"


@pytest.mark.slow
def test_scale_subresource_and_status_work_for_the_operator(kubectl):
    sample = str(ROOT / "manifests" / "samples" / "cpu-tiny-smollm2.yaml")
    kubectl("apply", "-n", "llm", "-f", sample)
    status = {"status": {"replicas": 2, "readyReplicas": 2, "mode": "Colocated",
                         "selector": "app.kubernetes.io/instance=smollm2-cpu",
                         "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady",
                                         "observedGeneration": 1,
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    kubectl(f"--as={OPERATOR}", "-n", "llm", "patch", "fisvc", "smollm2-cpu", "--subresource=status",
            "--type=merge", "-p", yaml.safe_dump(status))
    kubectl(f"--as={OPERATOR}", "-n", "llm", "scale", "fisvc", "smollm2-cpu", "--replicas", "3")
    scale = yaml.safe_load(kubectl("get", "--raw",
                                   "/apis/frota.dev/v1alpha1/namespaces/llm/inferenceservices/smollm2-cpu/scale").stdout)
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["selector"] == "app.kubernetes.io/instance=smollm2-cpu"
    table = kubectl("-n", "llm", "get", "fisvc", "smollm2-cpu").stdout
    assert "True" in table and "Colocated" in table


@pytest.mark.slow
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_operator_service_account_can_create_every_rendered_child(kubectl, path):
    rendered = subprocess.run([sys.executable, "-m", "frota.cli.main", "render", "-n", "llm", str(path)],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    # Real creation (not dry run), so RBAC escalation checks on the router's Role apply.
    kubectl(f"--as={OPERATOR}", "apply", "--server-side", "--field-manager=frota-operator", "-f", "-",
            stdin=rendered)


@pytest.mark.slow
@pytest.mark.parametrize(("verb", "resource", "allowed"), [
    ("get", "secrets", "no"), ("create", "pods", "no"), ("escalate", "roles", "no"),
    ("create", "secrets", "yes"), ("update", "secrets", "no"), ("list", "secrets", "no"),
    ("delete", "pods", "yes"), ("watch", "endpointslices.discovery.k8s.io", "yes"),
])
def test_operator_service_account_is_least_privileged(kubectl, verb, resource, allowed):
    out = kubectl("auth", "can-i", f"--as={OPERATOR}", "-n", "llm", verb, resource, check=False)
    assert out.stdout.strip() == allowed
