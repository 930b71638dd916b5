"""The local node agent: registers Nodes and runs the pods bound to them.

Test infrastructure standing in for kubelet + container runtime + CNI +
cluster DNS on a machine without Docker. Each Node gets capacity for cpu,
memory, pods and a configurable fake ``nvidia.com/gpu`` count and a Lease
renewed every 10 s. Pods bound to any of the agent's nodes run as local
processes (:mod:`e2e.cluster.podrunner`), each in its own network namespace.

Images are ignored: a container runs its ``command``/``args`` with PATH
starting at this virtualenv's bin (so ``frota worker ...`` resolves); a
container without ``command`` runs ``frota`` + ``args``
(``FROTA_E2E_DEFAULT_ENTRYPOINT`` overrides).

Name resolution (each pod's /etc/hosts, rewritten as pods and Services
change) follows cluster DNS: ``<hostname>.<subdomain>`` for pods of a headless
Service named ``<subdomain>`` that are ready (or any, with
``publishNotReadyAddresses``), and ``<service>`` names for the ready pods of a
Service. There is no kube-proxy: a ClusterIP Service's name resolves to one
ready pod's IP, so a client reaches it only when the Service's port equals
the target port; in-cluster clients such as the router discover pods through
EndpointSlices, which the real controller maintains.

Not emulated: ``kubectl exec``/``attach``/``port-forward`` (only the log API
is served), resource limits (nothing is enforced), preStop/postStart hooks,
ephemeral containers, persistent volumes, token refresh (tokens last an hour),
kube-proxy. A volume mount must not cover the directory of this checkout or
its virtualenv (the container would lose its commands); missing mount points
are created on the host and removed when the cluster stops.

Run ``python -m e2e.cluster.agent --help``; the harness starts it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.cluster import netns
from e2e.cluster.kubeapi import ApiError, KubeClient
from e2e.cluster.kubeletapi import serve_logs
from e2e.cluster.podrunner import PodRunner, now
from e2e.cluster.podspec import parse_quantity

log = logging.getLogger("frota.e2e.agent")
LEASE_S = 40
RENEW_S = 10
GPU = "nvidia.com/gpu"
KUBELET_PORT = 10250


def _micro_now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _selects(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def _dns_names(name: str, ns: str, viewer_ns: str) -> list[str]:
    names = [f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"]
    return [*names, name] if ns == viewer_ns else names


class NodeAgent:
    """Registers nodes, watches pods, and keeps one :class:`PodRunner` per bound pod."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.api = KubeClient(args.kubeconfig)
        self.work_dir = Path(args.work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.node_names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
        self.node_cpu = args.cpu
        self.args = args
        self.host_ip = netns.GATEWAY
        server = args.apiserver or self.api.server
        hostport = server.split("://", 1)[1]
        self.apiserver_host, _, port = hostport.rpartition(":")
        self.apiserver_port = int(port or 443)
        venv_bin = str(Path(sys.executable).parent)
        # Paths a volume mount must not cover: the containers' commands live there.
        self.must_stay_visible = [venv_bin, str(Path(__file__).resolve().parents[2])]
        self.container_path = f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        self.default_entrypoint = shlex.split(os.environ.get("FROTA_E2E_DEFAULT_ENTRYPOINT", "frota"))
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.runners: dict[str, PodRunner] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # every pod in the cluster, for DNS
        self.services: list[dict[str, Any]] = []
        self.free_indices = list(range(2, 255))
        self.gpu_alloc: dict[str, dict[str, list[int]]] = {n: {} for n in self.node_names}

    # --- resources shared by the runners -------------------------------------

    def allocate_index(self) -> int:
        """A free pod network index (the last octet of the pod IP)."""
        with self.lock:
            if not self.free_indices:
                raise RuntimeError("no free pod IP left in 10.244.0.0/24")
            return self.free_indices.pop(0)

    def release_index(self, index: int) -> None:
        """Return a pod network index."""
        with self.lock:
            self.free_indices.append(index)

    def gpu_ids(self, runner: PodRunner) -> str | None:
        """The fake GPU ids given to a pod (like a device plugin), or None if it asks none."""
        want = 0
        for c in runner.pod["spec"]["containers"]:
            res = c.get("resources", {})
            want += int(parse_quantity(res.get("limits", {}).get(GPU, res.get("requests", {}).get(GPU, 0))))
        if not want:
            return None
        node = runner.pod["spec"]["nodeName"]
        with self.lock:
            alloc = self.gpu_alloc[node]
            if runner.uid not in alloc:
                used = {i for ids in alloc.values() for i in ids}
                alloc[runner.uid] = [i for i in range(self.args.gpus) if i not in used][:want]
            return ",".join(str(i) for i in alloc[runner.uid])

    def log_file(self, ns: str, pod: str, container: str) -> tuple[Path, Callable[[], bool]] | None:
        """A container's log file (all its restarts) and whether it may still grow."""
        with self.lock:
            runner = next(
                (r for r in self.runners.values() if r.ns == ns and r.pod_name == pod), None
            )
        if runner is None:
            return None
        return runner.dir / f"{container}.log", runner.is_alive

    def runner_done(self, runner: PodRunner) -> None:
        """Forget a runner whose pod is gone."""
        with self.lock:
            if self.runners.get(runner.uid) is runner:
                del self.runners[runner.uid]
            for alloc in self.gpu_alloc.values():
                alloc.pop(runner.uid, None)

    def hosts_for(self, runner: PodRunner) -> str:
        """The hosts file of one pod: itself, pod names of headless Services, Services."""
        ns = runner.ns
        spec = runner.pod["spec"]
        hostname = spec.get("hostname") or runner.pod_name
        own = [hostname]
        if spec.get("subdomain"):
            own = [f"{hostname}.{spec['subdomain']}.{ns}.svc.cluster.local", hostname]
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        if runner.ip:
            lines.append(f"{runner.ip}\t{' '.join(own)}")
        # No kube-proxy: the apiserver's Service name points at the apiserver itself.
        lines.append(f"{self.apiserver_host}\t{' '.join(_dns_names('kubernetes', 'default', ns))}")
        with self.lock:
            pods, services = list(self.pods.values()), list(self.services)
        for svc in services:
            s_ns, s_name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            sspec = svc.get("spec", {})
            publish_all = sspec.get("publishNotReadyAddresses", False)
            members = [
                p for p in pods
                if p["metadata"]["namespace"] == s_ns
                and p.get("status", {}).get("podIP")
                and not p["metadata"].get("deletionTimestamp")
                and _selects(sspec.get("selector"), p["metadata"].get("labels", {}))
                and (publish_all or _is_ready(p))
            ]
            members.sort(key=lambda p: p["metadata"]["name"])
            svc_names = " ".join(_dns_names(s_name, s_ns, ns))
            if sspec.get("clusterIP") == "None":
                for p in members:
                    ip = p["status"]["podIP"]
                    lines.append(f"{ip}\t{svc_names}")
                    if p["spec"].get("hostname") and p["spec"].get("subdomain") == s_name:
                        names = _dns_names(f"{p['spec']['hostname']}.{s_name}", s_ns, ns)
                        lines.append(f"{ip}\t{' '.join(names)}")
            elif members:
                lines.append(f"{members[0]['status']['podIP']}\t{svc_names}")
        return "\n".join(lines) + "\n"

    # --- nodes ---------------------------------------------------------------

    def _node_status(self, name: str) -> dict[str, Any]:
        a = self.args
        capacity = {"cpu": a.cpu, "memory": a.memory, "pods": str(a.max_pods),
                    "ephemeral-storage": "100Gi"}
        if a.gpus:
            capacity[GPU] = str(a.gpus)
        t = now()
        conds = [("Ready", "True", "KubeletReady", "frota e2e node agent is ready")] + [
            (c, "False", f"KubeletHas{r}", "ok")
            for c, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                         ("PIDPressure", "SufficientPID"))
        ]
        return {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [
                {"type": c, "status": s, "reason": r, "message": m,
                 "lastHeartbeatTime": t, "lastTransitionTime": t}
                for c, s, r, m in conds
            ],
            "addresses": [{"type": "InternalIP", "address": self.host_ip},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name,
                "kernelVersion": os.uname().release, "osImage": "frota e2e node agent",
                "containerRuntimeVersion": "frota-local://0.1", "kubeletVersion": "v0.0.0-frota",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def register_nodes(self) -> None:
        """Create (or refresh) every Node and its Lease."""
        for name in self.node_names:
            body = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "frota.dev/e2e-node": "true",
                }},
                "spec": {},
            }
            try:
                self.api.post("/api/v1/nodes", body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": self._node_status(name)})
            log.info("registered node %s", name)

    def _renew_leases(self) -> None:
        for name in self.node_names:
            path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_S, "renewTime": _micro_now()}
            try:
                self.api.merge_patch(path, {"spec": spec})
            except ApiError as exc:
                if exc.status != 404:
                    raise
                node = self.api.get(f"/api/v1/nodes/{name}")
                self.api.post(path.rsplit("/", 1)[0], {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "ownerReferences": [{
                        "apiVersion": "v1", "kind": "Node", "name": name,
                        "uid": node["metadata"]["uid"]}]},
                    "spec": spec,
                })

    def _heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(RENEW_S):
            try:
                self._renew_leases()
                if time.monotonic() - last_status > 60:
                    for name in self.node_names:
                        self.api.merge_patch(
                            f"/api/v1/nodes/{name}/status", {"status": self._node_status(name)}
                        )
                    last_status = time.monotonic()
            except Exception as exc:
                log.warning("heartbeat: %s", exc)

    def _services_loop(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                items = self.api.get("/api/v1/services")["items"]
                with self.lock:
                    self.services = items
            except Exception as exc:
                log.warning("listing services: %s", exc)

    # --- pods ----------------------------------------------------------------

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = pod
            runner = self.runners.get(uid)
        if kind == "DELETED":
            if runner:
                runner.gone.set()
            return
        if runner:
            runner.update(pod)
            return
        if pod["spec"].get("nodeName") not in self.node_names:
            return
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            if pod["metadata"].get("deletionTimestamp"):
                # Ours but not running (e.g. from before a restart): finish the deletion.
                with contextlib.suppress(ApiError):
                    self.api.delete(
                        f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                        {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                    )
            return
        runner = PodRunner(self, pod)
        with self.lock:
            self.runners[uid] = runner
        runner.update(pod)
        runner.start()

    def _watch_pods(self) -> None:
        while not self.stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods")
                seen = {p["metadata"]["uid"] for p in listing["items"]}
                with self.lock:
                    stale = [r for uid, r in self.runners.items() if uid not in seen]
                    self.pods = {p["metadata"]["uid"]: p for p in listing["items"]}
                for r in stale:
                    r.gone.set()
                for p in listing["items"]:
                    self._handle("ADDED", p)
                rv = listing["metadata"]["resourceVersion"]
                while not self.stopping.is_set():
                    for ev in self.api.watch("/api/v1/pods", rv, timeout_s=50):
                        if ev["type"] == "ERROR":
                            raise ApiError(ev["object"].get("code", 500), str(ev["object"]))
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            self._handle(ev["type"], ev["object"])
                        if self.stopping.is_set():
                            break
            except Exception as exc:
                if not self.stopping.is_set():
                    log.info("pod watch restarting: %s", exc)
                    time.sleep(1)

    # --- main ----------------------------------------------------------------

    def run(self) -> None:
        """Register nodes, then serve until SIGTERM/SIGINT; then kill every pod."""
        netns.ensure_bridge()
        if self.args.serving_cert:
            serve_logs(self.host_ip, KUBELET_PORT, Path(self.args.serving_cert),
                       Path(self.args.serving_key), self.log_file)
        self.register_nodes()
        self._renew_leases()
        for target in (self._heartbeat_loop, self._services_loop, self._watch_pods):
            threading.Thread(target=target, daemon=True, name=target.__name__).start()
        self.stopping.wait()
        log.info("stopping: killing all pods")
        with self.lock:
            runners = list(self.runners.values())
        for r in runners:
            r.join(timeout=15)
        netns.cleanup_all_pods()


def main(argv: list[str] | None = None) -> None:
    """Run the node agent (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m e2e.cluster.agent", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--work-dir", required=True, help="where pod logs, volumes and shims go")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--node-prefix", default="frota-node")
    p.add_argument("--gpus", type=int, default=0, help="fake nvidia.com/gpu per node")
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--max-pods", type=int, default=110)
    p.add_argument("--apiserver", default="", help="address pods use for the apiserver")
    p.add_argument("--serving-cert", default="", help="certificate of the log API (port 10250)")
    p.add_argument("--serving-key", default="")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    agent = NodeAgent(args)

    def stop(*_: object) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()


if __name__ == "__main__":
    main()
