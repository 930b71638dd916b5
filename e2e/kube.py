"""What the e2e tests know about a cluster: a kubeconfig, kubectl, and its kind nodes.

Pods are reached the way a user reaches them: ``kubectl port-forward`` to a pod
or a Service, or a Service's ClusterIP routed through a node (kube-proxy's
rules do the rest). The nodes are kind's containers, so a test can act on a
node as an operator with a shell on it would (``crictl``).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOAD_SCRIPT = Path(__file__).parent / "kind" / "load.sh"


@dataclass
class Cluster:
    """A handle on the cluster under test."""

    kubeconfig: str
    kubectl_path: str = "kubectl"
    image: str = "frota-worker:dev"  # what the tests' own pods run
    kind_cluster: str = "frota-e2e"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run kubectl; return stdout, raise with stderr on failure."""
        proc = subprocess.run(
            [self.kubectl_path, "--kubeconfig", self.kubeconfig, *args],
            input=input, capture_output=True, text=True, timeout=120,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, *objects: dict[str, Any], namespace: str | None = None) -> None:
        """Server-side apply objects."""
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", "--server-side", "--field-manager=frota-e2e", *ns, "-f", "-",
                     input=yaml.safe_dump_all(objects))

    def get(self, kind: str, name: str = "", namespace: str | None = None, **selector: str) -> Any:
        """``kubectl get -o json`` decoded; a list's items when no name is given."""
        args = ["get", kind, *([name] if name else [])]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", ",".join(f"{k}={v}" for k, v in selector.items())]
        out = json.loads(self.kubectl(*args, "-o", "json"))
        return out if name else out["items"]

    def wait_crds_established(self, names: list[str] | None = None, timeout: float = 60) -> None:
        """Wait until the named CRDs (default: all) are Established.

        Polls instead of ``kubectl wait``, which errors on a CRD whose status
        has no conditions yet.
        """

        def established() -> bool:
            crds = self.get("crd")
            if names is not None:
                crds = [c for c in crds if c["metadata"]["name"] in names]
                if len(crds) < len(names):
                    return False
            return all(
                any(c["type"] == "Established" and c["status"] == "True"
                    for c in crd.get("status", {}).get("conditions") or [])
                for crd in crds
            )

        wait_until(f"CRDs {names or 'all'} to be Established", established, timeout)

    @contextlib.contextmanager
    def reach(self, namespace: str, target: str, port: int) -> Iterator[tuple[str, int]]:
        """A (host, port) on this machine that reaches ``port`` of ``target``.

        ``target`` is a pod name or ``svc/NAME``; the way is ``kubectl port-forward``.
        """
        ref = target if "/" in target else f"pod/{target}"
        proc = subprocess.Popen(
            [self.kubectl_path, "--kubeconfig", self.kubeconfig, "-n", namespace,
             "port-forward", ref, f":{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            if not m:
                raise RuntimeError(f"kubectl port-forward {ref} said: {line!r}")
            yield "127.0.0.1", int(m.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    @contextlib.contextmanager
    def route_to_cluster_ip(self, namespace: str, service: str) -> Iterator[str]:
        """The Service's ClusterIP, routed from this machine through a node.

        The packets enter the node as they would from any client on its network;
        kube-proxy's rules there pick an endpoint and masquerade the reply path.
        """
        ip = self.get("service", service, namespace)["spec"]["clusterIP"]
        node_ip = next(a["address"] for a in self.get("nodes")[0]["status"]["addresses"]
                       if a["type"] == "InternalIP")
        subprocess.run(["ip", "route", "replace", f"{ip}/32", "via", node_ip], check=True)
        try:
            yield ip
        finally:
            subprocess.run(["ip", "route", "del", f"{ip}/32"], check=False)

    def load_image(self, image: str) -> None:
        """Put a local Docker image into the nodes that run pods (``e2e/kind/load.sh``: as
        ``kind load docker-image``, but each layer stored once, and a re-tag only tagged)."""
        workers = [n["metadata"]["name"] for n in self.get("nodes")
                   if "node-role.kubernetes.io/control-plane" not in n["metadata"]["labels"]]
        proc = subprocess.run(["bash", str(LOAD_SCRIPT), ",".join(workers), image],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"loading {image} into {workers} failed: {proc.stderr.strip()}")

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The events about one object, oldest first."""
        out = json.loads(self.kubectl("get", "events", "-n", namespace, "--field-selector",
                                      f"involvedObject.name={name}", "-o", "json"))
        return sorted(out["items"], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def node_shell(self, node: str, script: str) -> str:
        """Run ``script`` with sh on a node (a kind node is a container named after it)."""
        proc = subprocess.run(["docker", "exec", node, "sh", "-c", script],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"on node {node}: {script!r} failed: {proc.stderr.strip()}")
        return proc.stdout

    def kill_container(self, namespace: str, pod: str, container: str) -> None:
        """SIGKILL a container's main process from its node, as the OOM killer or a crash would."""
        self.signal_container(namespace, pod, container, "KILL")

    def signal_container(self, namespace: str, pod: str, container: str, signal: str) -> None:
        """Send ``signal`` to a container's main process from its node (a process cannot
        be stopped or killed from inside its own PID namespace, where it is init)."""
        node = self.get("pod", pod, namespace)["spec"]["nodeName"]
        cid = self.node_shell(node, (
            f"crictl ps -q --name '^{container}$' --label io.kubernetes.pod.name={pod} "
            f"--label io.kubernetes.pod.namespace={namespace}")).split()
        assert len(cid) == 1, f"expected one running {container} container in {pod}, got {cid}"
        pid = self.node_shell(node, f"crictl inspect --output go-template --template "
                                    f"'{{{{.info.pid}}}}' {cid[0]}").strip()
        self.node_shell(node, f"kill -{signal} {pid}")


def wait_until(what: str, check: Callable[[], Any], timeout: float = 90, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # not there yet
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


# Every namespace the suite makes enforces this Pod Security level, as the
# operator's own namespace does (manifests/base/namespace.yaml).
POD_SECURITY = {"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"}


def make_namespace(cluster: Cluster) -> str:
    """A fresh namespace enforcing restricted Pod Security, ready for pods."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "labels": POD_SECURITY}})
    # Pods are refused until the controller has made the namespace's default account.
    wait_until("the default service account", lambda: cluster.get("serviceaccount", "default", name))
    return name


RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted(pod: dict[str, Any]) -> dict[str, Any]:
    """A Pod manifest given what the ``restricted`` Pod Security level asks of it."""
    spec = pod["spec"]
    spec["securityContext"] = {**RESTRICTED_POD, **spec.get("securityContext", {})}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        c["securityContext"] = {**RESTRICTED_CONTAINER, **c.get("securityContext", {})}
    return pod


def pod_is_ready(pod: dict[str, Any]) -> bool:
    """Whether a pod's Ready condition is True."""
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )
