"""What the e2e tests know about a cluster: a kubeconfig, kubectl and an address strategy.

Nothing here depends on how the cluster was made, so the same tests run on the
local control plane (``address="pod-ip"``: the host reaches pod IPs directly)
and on kind (``address="port-forward"``: through ``kubectl port-forward``).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass
class Cluster:
    """A handle on the cluster under test."""

    kubeconfig: str
    kubectl_path: str = "kubectl"
    address: str = "pod-ip"  # or "port-forward"
    image: str = "frota-worker:e2e"  # what pods declare; the local agent ignores it

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
    def reach(self, namespace: str, pod: str, port: int) -> Iterator[tuple[str, int]]:
        """A (host, port) on this machine that reaches ``port`` of ``pod``."""
        if self.address == "pod-ip":
            yield self.get("pod", pod, namespace)["status"]["podIP"], port
            return
        proc = subprocess.Popen(
            [self.kubectl_path, "--kubeconfig", self.kubeconfig, "-n", namespace,
             "port-forward", f"pod/{pod}", f":{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            if not m:
                raise RuntimeError(f"kubectl port-forward said: {line!r}")
            yield "127.0.0.1", int(m.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


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


def pod_is_ready(pod: dict[str, Any]) -> bool:
    """Whether a pod's Ready condition is True."""
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )
