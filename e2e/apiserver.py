"""A throwaway etcd + kube-apiserver on loopback, for tests and benchmarks that need only the API.

No controllers, scheduler or nodes: objects are admitted (or refused) exactly as
in a cluster, with RBAC enforced, but nothing runs. The binaries come from
``e2e/cluster/build.sh`` (cached under ``~/.cache/frota-e2e``).

    with apiserver(find_binaries(), work_dir) as kubeconfig: ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

REQUIRED = ("etcd", "kube-apiserver", "kubectl")
ADMIN_TOKEN = "admin-token"


def find_binaries() -> Path | None:
    """The newest cached bin dir holding etcd, kube-apiserver and kubectl (FROTA_E2E_BIN first)."""
    candidates = [Path(os.environ["FROTA_E2E_BIN"])] if os.environ.get("FROTA_E2E_BIN") else []
    cache = Path(os.environ.get("FROTA_E2E_CACHE", Path.home() / ".cache/frota-e2e")) / "bin"
    candidates += sorted(cache.glob("k8s-*"), reverse=True)
    return next((d for d in candidates if not d.name.endswith(".partial")
                 and all((d / b).exists() for b in REQUIRED)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def apiserver(bins: Path, work: Path, timeout: float = 120) -> Iterator[Path]:
    """Start etcd and kube-apiserver in ``work``; yield a kubeconfig of a cluster admin."""
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"], check=True,
                   capture_output=True)
    (work / "tokens.csv").write_text(f"{ADMIN_TOKEN},admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(work / name, "w"))
                for name in ("etcd.log", "apiserver.log")]
        procs = [
            subprocess.Popen([
                str(bins / "etcd"), "--data-dir", str(work / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                # Test data only: skipping fsync keeps etcd fast on a shared disk.
                "--unsafe-no-fsync"], stdout=logs[0], stderr=subprocess.STDOUT),
            subprocess.Popen([
                str(bins / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                "--secure-port", str(api_port), "--bind-address", "127.0.0.1",
                "--cert-dir", str(work / "certs"),
                "--service-account-key-file", str(work / "sa.key"),
                "--service-account-signing-key-file", str(work / "sa.key"),
                "--service-account-issuer", "https://frota-test",
                "--token-auth-file", str(work / "tokens.csv"),
                "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/16"],
                stdout=logs[1], stderr=subprocess.STDOUT),
        ]
        for proc in reversed(procs):
            stack.callback(proc.wait, 30)
            stack.callback(proc.terminate)
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{api_port}",
                                                   "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))
        deadline = time.monotonic() + timeout
        while subprocess.run([str(bins / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "--raw",
                              "/readyz"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("kube-apiserver not ready: "
                                   + (work / "apiserver.log").read_text()[-3000:])
            time.sleep(0.5)
        yield kubeconfig
