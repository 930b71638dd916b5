"""Start and stop a real Kubernetes control plane from local binaries.

etcd, kube-apiserver (RBAC, service-account issuer), kube-controller-manager
(all default controllers, each with its own service account) and
kube-scheduler run as child processes in their own sessions; the node agent
(:mod:`e2e.cluster.agent`) registers Nodes and runs the pods bound to them.
Every PID is recorded under the work directory so :meth:`LocalCluster.stop`
works from another process too (``python -m e2e.cluster down``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from e2e.cluster import netns
from e2e.cluster.kubeapi import ApiError, KubeClient
from e2e.cluster.pki import Pki, make_pki
from e2e.cluster.podrunner import MOUNTPOINTS_FILE

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = Path(__file__).with_name("build.sh")
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Stopped in this order: the agent first (it kills the pods), etcd last.
# Held while a cluster with pod networking (bridge, 10.244.0.0/24) lives.
LOCK_FILE = "/run/frota-e2e.lock"
STOP_ORDER = ("agent", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def find_binaries() -> Path | None:
    """The cached bin dir when every binary is there (FROTA_E2E_BIN overrides)."""
    if os.environ.get("FROTA_E2E_BIN"):
        d = Path(os.environ["FROTA_E2E_BIN"])
        return d if all((d / b).exists() for b in BINARIES) else None
    cache = Path(os.environ.get("FROTA_E2E_CACHE", Path.home() / ".cache/frota-e2e")) / "bin"
    for d in sorted(cache.glob("k8s-*"), reverse=True):
        if not d.name.endswith(".partial") and all((d / b).exists() for b in BINARIES):
            return d
    return None


def build_binaries() -> Path:
    """Run build.sh (reusing the cache) and return the bin dir it prints."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError("e2e/cluster/build.sh failed; see its output above")
    return Path(proc.stdout.strip().splitlines()[-1])


def wait_for(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.5) -> None:
    """Poll ``check`` until it is true or raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # the component may not be up yet
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


@dataclass
class ClusterOptions:
    """Knobs of the local cluster."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpu: str = "16"
    memory: str = "64Gi"
    max_pods: int = 110
    work_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("FROTA_E2E_WORK", REPO / "e2e/.work"))
    )


class LocalCluster:
    """A control plane plus node agent on this machine; a context manager."""

    def __init__(self, bin_dir: Path, options: ClusterOptions | None = None) -> None:
        self.bin_dir = bin_dir
        self.options = options or ClusterOptions()
        self.work = self.options.work_dir.resolve()
        self.kubeconfig = self.work / "kubeconfig"
        self.host_ip = netns.GATEWAY
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock_fd: int | None = None

    # --- lifecycle -------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException as exc:
            self.stop()
            raise RuntimeError(f"local cluster failed to start: {exc}\n{self.log_tails()}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """Start everything and wait until a node is Ready and accounts exist."""
        reason = netns.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self._lock_machine()
        self._stop_recorded()  # leftovers of an earlier run in the same work dir
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "logs").mkdir(parents=True)
        # Marks that this cluster owns the pod networking (one per machine),
        # so stop() tears it down and a cluster without an agent does not.
        (self.work / "network").touch()
        netns.ensure_bridge()
        pki = make_pki(
            self.work / "pki",
            ips=["127.0.0.1", self.host_ip, SERVICE_IP],
            dns_names=[
                "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        etcd_port, peer_port = free_port(), free_port()
        # 443 as in a cluster, so https://kubernetes.default.svc works from pods.
        api_port = 443 if self._port_free(self.host_ip, 443) else free_port(self.host_ip)
        self.server = f"https://{self.host_ip}:{api_port}"
        self._write_kubeconfig(pki)
        self._start_etcd(etcd_port, peer_port)
        self._start_apiserver(pki, etcd_port, api_port)
        client = KubeClient(self.kubeconfig)
        try:
            wait_for("kube-apiserver /readyz", lambda: self._readyz(client), timeout)
            self._start_controllers(pki)
            self._start_agent()
            wait_for("a Ready node", lambda: self._node_ready(client), timeout)
            wait_for(
                "the default service account",
                lambda: bool(client.get("/api/v1/namespaces/default/serviceaccounts/default")),
                timeout,
            )
        finally:
            client.close()

    def _lock_machine(self) -> None:
        """Take the machine-wide lock on pod networking (one such cluster at a time).

        The agent inherits the descriptor, so the lock lives as long as the
        cluster does, also after ``python -m e2e.cluster up`` returns.
        """
        fd = os.open(LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
        wait = float(os.environ.get("FROTA_E2E_LOCK_WAIT", "1800"))
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"another local e2e cluster holds {LOCK_FILE} (waited {wait:.0f}s); "
                        "let it finish, or stop it with python -m e2e.cluster down --work-dir DIR"
                    ) from None
                if not told:
                    print(f"waiting for another local e2e cluster to finish ({LOCK_FILE})",
                          file=sys.stderr, flush=True)
                    told = True
                time.sleep(2)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = fd

    def stop(self) -> None:
        """Stop every recorded process (agent first), remove pod networking, unlock."""
        self._stop_recorded()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _stop_recorded(self) -> None:
        pids = self._read_pids()
        for name in STOP_ORDER:
            for pid in pids.get(name, []):
                self._terminate(pid, grace=20.0 if name == "agent" else 5.0)
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._procs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.work / "pids").unlink()
        if (self.work / "network").exists():
            netns.cleanup_all()
            netns.remove_created_paths(self.work / "pods" / MOUNTPOINTS_FILE)
            (self.work / "network").unlink()

    # --- helpers ---------------------------------------------------------

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every component's log, for failure messages."""
        out = []
        for log in sorted((self.work / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log}\n" + "\n".join(tail))
        return "\n".join(out)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, check=check,
        )

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        log = (self.work / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=self.work, pass_fds=pass_fds,
        )
        self._procs[name] = proc
        with (self.work / "pids").open("a") as f:
            f.write(f"{name} {proc.pid}\n")
        time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at once; see {self.work}/logs/{name}.log")

    def _read_pids(self) -> dict[str, list[int]]:
        pids: dict[str, list[int]] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in (self.work / "pids").read_text().splitlines():
                name, pid = line.split()
                pids.setdefault(name, []).append(int(pid))
        return pids

    @staticmethod
    def _terminate(pid: int, grace: float) -> None:
        """SIGTERM a process group, SIGKILL it after ``grace`` seconds."""
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    @staticmethod
    def _port_free(host: str, port: int) -> bool:
        with socket.socket() as s:
            # As the apiserver binds: connections of an earlier run in
            # TIME_WAIT do not make the port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
            return True

    def _write_kubeconfig(self, pki: Pki) -> None:
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: frota-e2e\n  cluster:\n    server: {self.server}\n"
            f"    certificate-authority: {pki.ca_crt}\n"
            f"users:\n- name: admin\n  user:\n    client-certificate: {pki.admin_crt}\n"
            f"    client-key: {pki.admin_key}\n"
            "contexts:\n- name: frota-e2e\n  context:\n    cluster: frota-e2e\n    user: admin\n"
            "current-context: frota-e2e\n"
        )

    def _start_etcd(self, port: int, peer_port: int) -> None:
        client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "default",
            "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}",
            # Test data only: skipping fsync keeps etcd fast on a shared disk.
            "--unsafe-no-fsync", "--quota-backend-bytes", str(2 << 30),
            "--listen-metrics-urls", f"http://127.0.0.1:{free_port()}",
        ])
        wait_for(
            "etcd /health",
            lambda: httpx.get(f"{client_url}/health", timeout=2).status_code == 200,
            60,
        )

    def _start_apiserver(self, pki: Pki, etcd_port: int, api_port: int) -> None:
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.host_ip}", f"--secure-port={api_port}",
            f"--advertise-address={self.host_ip}",
            f"--tls-cert-file={pki.apiserver_crt}", f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_crt}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={pki.admin_crt}",
            f"--kubelet-client-key={pki.admin_key}",
            f"--kubelet-certificate-authority={pki.ca_crt}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--cert-dir={self.work / 'apiserver-certs'}",
            "--profiling=false",
            "--v=1",
        ])

    def _start_controllers(self, pki: Pki) -> None:
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--controllers=*", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_crt}",
            f"--cluster-signing-cert-file={pki.ca_crt}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false", "--profiling=false", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--profiling=false", "--v=1",
        ])

    def _start_agent(self) -> None:
        o = self.options
        self._spawn("agent", [
            sys.executable, "-m", "e2e.cluster.agent",
            "--kubeconfig", str(self.kubeconfig), "--work-dir", str(self.work / "pods"),
            "--nodes", str(o.nodes), "--gpus", str(o.gpus_per_node),
            "--cpu", o.cpu, "--memory", o.memory, "--max-pods", str(o.max_pods),
            "--apiserver", self.server,
            "--serving-cert", str(self.work / "pki/kubelet.crt"),
            "--serving-key", str(self.work / "pki/kubelet.key"),
        ], env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
           pass_fds=(self._lock_fd,) if self._lock_fd is not None else ())

    @staticmethod
    def _readyz(client: KubeClient) -> bool:
        resp = client.http.get("/readyz")
        return resp.status_code == 200

    @staticmethod
    def _node_ready(client: KubeClient) -> bool:
        try:
            nodes = client.get("/api/v1/nodes")["items"]
        except ApiError:
            return False
        return bool(nodes) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            and not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints", []))
            for n in nodes
        )
