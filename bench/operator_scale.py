"""Operator benchmark: create N InferenceServices, time until every child exists.

(Named operator_scale, not operator: run as a script, bench/operator.py would
shadow the standard library's `operator` module.)

    python bench/operator_scale.py [--count 100] [--png out.png] [--kubeconfig PATH]

Without --kubeconfig it starts a throwaway etcd + kube-apiserver
(e2e/apiserver.py, binaries from e2e/cluster/build.sh) in its own work
directory: no nodes, so pods stay Pending and this measures the operator, not
the pods. With --kubeconfig (a kind cluster, say) it cordons the nodes. It installs the CRD, runs `frota operator` as a child process, and
creates the InferenceServices in one burst. It prints JSON: seconds from the
first create until every desired child of every InferenceService exists, the
operator's CPU-seconds and peak RSS, and the targets (<= 30 s, <= 150 MB).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.processes import free_port  # noqa: E402 (the tests' process harness)

NAMESPACE = "frota-bench"
TARGET_SECONDS = 30.0
TARGET_RSS_MB = 150.0
CHILD_PATHS = {
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}
TEMPLATE: dict[str, Any] = {
    "apiVersion": "frota.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "bench", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "smollm2", "uri": "alias:smollm2"},
        "engine": {"dtype": "float32", "maxModelLen": 2048},
        "resources": {"cpu": "1", "memory": "3Gi"},
        "replicas": 1,
    },
}


def manifests(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        m = copy.deepcopy(TEMPLATE)
        m["metadata"]["name"] = f"bench-{i:03d}"
        out.append(m)
    return out


def expected_children(manifest: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every child the operator should create for one manifest."""
    from frota.operator.loop.desired import desired_state

    body = {**manifest, "metadata": {**manifest["metadata"], "uid": "bench", "generation": 1}}
    desired = desired_state(body)
    objs = list(desired.shared)
    for role, wanted in desired.replicas.items():
        for index in range(wanted):
            objs.extend(desired.render_group(role, index))
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


# Metadata-only lists: the benchmark's polling should cost the API server little.
METADATA_ONLY = {"Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"}


def existing_children(client: Any) -> set[tuple[str, str]]:
    found = set()
    for kind, path in CHILD_PATHS.items():
        resp = client.http.get(path.format(ns=NAMESPACE), headers=METADATA_ONLY,
                               params={"labelSelector": "app.kubernetes.io/name=frota"})
        resp.raise_for_status()
        data = resp.json()
        found |= {(kind, item["metadata"]["name"]) for item in data.get("items") or []}
    return found


class Sampler:
    """CPU-seconds and peak RSS of a process and its children."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss = 0

    def sample(self) -> None:
        with_children = [self.proc, *self.proc.children(recursive=True)]
        rss = 0
        for p in with_children:
            with suppress(psutil.NoSuchProcess):
                rss += p.memory_info().rss
        self.peak_rss = max(self.peak_rss, rss)

    def cpu_seconds(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system


def run(args: argparse.Namespace) -> dict[str, Any]:
    from e2e.kubeapi import KubeClient

    with ExitStack() as stack:
        kubeconfig = args.kubeconfig
        if kubeconfig is None:
            kubeconfig = stack.enter_context(local_cluster(args.bin_dir))
        client = KubeClient(kubeconfig)
        stack.callback(client.close)
        kubectl = os.environ.get("KUBECTL", "kubectl")
        if args.kubectl_dir:
            kubectl = str(Path(args.kubectl_dir) / "kubectl")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        for node in client.get("/api/v1/nodes").get("items", []):
            client.merge_patch(f"/api/v1/nodes/{node['metadata']['name']}",
                               {"spec": {"unschedulable": True}})
        subprocess.run([kubectl, "apply", "-f", args.crd], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        wait_established(client)
        subprocess.run([kubectl, "create", "namespace", NAMESPACE], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = stack.enter_context(tempfile.NamedTemporaryFile("w+", suffix=".log"))
        health_port = free_port()
        operator = subprocess.Popen(
            [sys.executable, "-m", "frota.cli.main", "operator", "--namespace", NAMESPACE,
             "--standalone", "--metrics-port", "0",
             "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        stack.callback(operator.wait, 15)
        stack.callback(operator.terminate)
        sampler = Sampler(operator.pid)
        wait_healthy(health_port, operator)
        docs = manifests(args.count)
        wanted: set[tuple[str, str]] = set()
        for doc in docs:
            wanted |= expected_children(doc)
        cpu_before = sampler.cpu_seconds()
        started = time.monotonic()
        for doc in docs:
            client.post(f"/apis/frota.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices", doc)
        timeline = []
        deadline = started + args.timeout
        seen: set[tuple[str, str]] = set()
        while time.monotonic() < deadline:
            sampler.sample()
            seen = existing_children(client) & wanted
            timeline.append((time.monotonic() - started, len(seen)))
            if seen == wanted:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        sampler.sample()
        result = {
            "benchmark": "operator",
            "inference_services": args.count,
            "children_expected": len(wanted),
            "children_created": len(seen),
            "seconds_until_all_children_exist": round(elapsed, 2) if seen == wanted else None,
            "operator_cpu_seconds": round(sampler.cpu_seconds() - cpu_before, 2),
            "operator_peak_rss_mb": round(sampler.peak_rss / 2**20, 1),
            "targets": {"seconds": TARGET_SECONDS, "rss_mb": TARGET_RSS_MB},
        }
        result["meets_targets"] = bool(
            result["seconds_until_all_children_exist"] is not None
            and elapsed <= TARGET_SECONDS and result["operator_peak_rss_mb"] <= TARGET_RSS_MB
        )
        if args.png:
            draw(timeline, len(wanted), args.png)
        if seen != wanted:
            log.seek(0)
            result["operator_log_tail"] = log.read()[-3000:]
        return result


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Wait for kopf's liveness endpoint (it answers once the operator runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the operator did not become healthy")


def wait_established(client: Any, timeout: float = 60.0) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.frota.dev"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conds = (client.get(path).get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            try:  # the new resource's storage answers 429 while it initializes
                client.get("/apis/frota.dev/v1alpha1/inferenceservices")
                return
            except Exception:
                pass
        time.sleep(0.2)
    raise TimeoutError("the CRD was not established")


@contextmanager
def local_cluster(bin_dir: str | None) -> Iterator[Path]:
    """A throwaway etcd + kube-apiserver in a work directory of its own; yields its kubeconfig."""
    from e2e.apiserver import apiserver, find_binaries

    bins = Path(bin_dir) if bin_dir else find_binaries()
    if bins is None:
        raise SystemExit("no cached Kubernetes binaries: run e2e/cluster/build.sh first "
                         "(or pass --bin-dir, or --kubeconfig of a cluster)")
    os.environ["PATH"] = f"{bins}{os.pathsep}{os.environ['PATH']}"  # its kubectl
    with (tempfile.TemporaryDirectory(prefix="frota-bench-operator-") as work,
          apiserver(bins, Path(work)) as kubeconfig):
        yield kubeconfig


def draw(timeline: list[tuple[float, int]], total: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, ys = zip(*timeline, strict=True) if timeline else ((), ())
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, ys, label="children that exist")
    ax.axhline(total, linestyle="--", color="grey", label="expected")
    ax.axvline(TARGET_SECONDS, linestyle=":", color="red", label="target")
    ax.set_xlabel("seconds since the first create")
    ax.set_ylabel("child objects")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100, help="InferenceServices to create")
    p.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds")
    p.add_argument("--kubeconfig", default=None, help="use this cluster instead of starting one")
    p.add_argument("--kubectl-dir", default=None, help="directory holding kubectl")
    p.add_argument("--bin-dir", default=None,
                   help="directory holding etcd, kube-apiserver and kubectl (default: the e2e cache)")
    p.add_argument("--crd", default=str(REPO / "crds" / "frota.dev_inferenceservices.yaml"),
                   help="the CRD file to install")
    p.add_argument("--png", default=None, help="draw children over time into this PNG")
    result = run(p.parse_args())
    print(json.dumps(result, indent=2))
    return 0 if result["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
