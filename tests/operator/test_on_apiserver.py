"""The CRD, samples, operator RBAC and rendered children against a real kube-apiserver.

Runs when the e2e suite's Kubernetes binaries are cached (etcd, kube-apiserver,
kubectl; see e2e/cluster); skipped otherwise. Only etcd and the apiserver start:
no scheduler or nodes, so nothing runs, but everything is admitted (or refused)
exactly as in a cluster, with RBAC enforced.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
OPERATOR = "system:serviceaccount:frota-system:frota-operator"


def _bin_dir() -> Path | None:
    candidates = [Path(os.environ["FROTA_E2E_BIN"])] if os.environ.get("FROTA_E2E_BIN") else []
    cache = Path(os.environ.get("FROTA_E2E_CACHE", Path.home() / ".cache/frota-e2e")) / "bin"
    candidates += sorted(cache.glob("k8s-*"), reverse=True)
    for d in candidates:
        if all((d / b).exists() for b in ("etcd", "kube-apiserver", "kubectl")):
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    bins = _bin_dir()
    if bins is None:
        pytest.skip("no cached Kubernetes binaries (build them with `python -m e2e.cluster up`)")
    work = tmp_path_factory.mktemp("apiserver")
    subprocess.run(["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True)
    (work / "tokens.csv").write_text("admin-token,admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    logs = [open(work / "etcd.log", "w"), open(work / "apiserver.log", "w")]  # noqa: SIM115
    procs = [
        subprocess.Popen([str(bins / "etcd"), "--data-dir", str(work / "etcd"),
                          "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                          "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                          "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"],
                         stdout=logs[0], stderr=subprocess.STDOUT),
        subprocess.Popen([str(bins / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                          "--secure-port", str(api_port), "--bind-address", "127.0.0.1",
                          "--cert-dir", str(work / "certs"),
                          "--service-account-key-file", str(work / "sa.key"),
                          "--service-account-signing-key-file", str(work / "sa.key"),
                          "--service-account-issuer", "https://frota-test",
                          "--token-auth-file", str(work / "tokens.csv"),
                          "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/16"],
                         stdout=logs[1], stderr=subprocess.STDOUT),
    ]
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{api_port}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "admin-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    k = Kubectl(bins / "kubectl", kubeconfig)
    try:
        deadline = time.monotonic() + 120
        while k("get", "--raw", "/readyz", check=False).returncode != 0:
            assert time.monotonic() < deadline, (work / "apiserver.log").read_text()[-3000:]
            time.sleep(0.5)
        # The operator's install, as a user would: CRDs first, then everything.
        overlay = str(ROOT / "manifests" / "overlays" / "production")
        k("apply", "--server-side", "-k", overlay, check=False)
        k("wait", "--for=condition=Established", "crd/inferenceservices.frota.dev", "--timeout=60s")
        k("apply", "--server-side", "-k", overlay)
        k("create", "namespace", "llm")
        yield k
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        for log in logs:
            log.close()


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
    ("delete", "pods", "yes"), ("watch", "endpointslices.discovery.k8s.io", "yes"),
])
def test_operator_service_account_is_least_privileged(kubectl, verb, resource, allowed):
    out = kubectl("auth", "can-i", f"--as={OPERATOR}", "-n", "llm", verb, resource, check=False)
    assert out.stdout.strip() == allowed
