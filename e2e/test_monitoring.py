"""Monitoring on the cluster: the Prometheus that e2e/cluster/prometheus.sh builds runs as a pod
in its own namespace (labelled frota.dev/monitoring=true, as docs/operations.md asks), finds the
operator, the router and the workers by Kubernetes service discovery with the selectors of
manifests/monitoring/scrape.yaml (rendered by scrape.py), and loads the alert rules. After load
through the router (streams, a repeated prompt, a burst past the admission limit), every query
of every dashboard panel and every alert's expression (without its threshold) returns data.

One disaggregated fleet (a prefill and a decode group), so the P/D panels have data too.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from e2e import fleet
from e2e.fleet import chat, router_client, wait_ready
from e2e.kube import Cluster, pod_is_ready, restricted, wait_until
from tests.monitoring.promtools import MONITORING, NO_PROMTOOL, PROMETHEUS, PROMETHEUS_VERSION
from tests.monitoring.scrape_configs import scrape_configs

NAME = "mon"
IMAGE = f"frota-e2e-prometheus:{PROMETHEUS_VERSION}"
OPERATOR_IMAGE = "frota-operator:dev"  # the base: a non-root image every node holds
PROMPT = "What is the capital of France? Answer in one word."
SCRAPE = "5s"
# What the dashboards' variables stand for here; a window that holds several scrapes.
RATE_INTERVAL = "2m"
RULES = MONITORING / "rules" / "frota.rules.yaml"
DASHBOARDS = [MONITORING / "dashboards" / n for n in ("fleet.json", "operator.json")]
_THRESHOLD = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.]+\s*$")


def _prometheus_image(cluster: Cluster) -> str:
    """An image of the static prometheus binary on the operator image, loaded into the nodes."""
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(PROMETHEUS, Path(context) / "prometheus")
        (Path(context) / "Dockerfile").write_text(
            f"FROM {OPERATOR_IMAGE}\nCOPY prometheus /usr/local/bin/prometheus\n"
            "USER 10001\nENTRYPOINT [\"/usr/local/bin/prometheus\"]\n")
        subprocess.run(["docker", "build", "-q", "-t", IMAGE, context], check=True,
                       capture_output=True, timeout=300, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    cluster.load_image(IMAGE)
    return IMAGE


def _config() -> str:
    return yaml.safe_dump({
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": ["/etc/prometheus/frota.rules.yaml"],
        "scrape_configs": scrape_configs(scrape_interval=SCRAPE),
    })


def _objects(ns: str, image: str) -> list[dict[str, Any]]:
    """The ServiceAccount, the cluster-wide read of pods and endpoints that discovery needs,
    the configuration and the pod."""
    role = f"frota-e2e-prometheus-{ns}"
    pod = restricted({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "prometheus", "namespace": ns, "labels": {"app": "prometheus"}},
        "spec": {
            "serviceAccountName": "prometheus",
            "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
            "containers": [{
                "name": "prometheus", "image": image, "imagePullPolicy": "Never",
                "args": ["--config.file=/etc/prometheus/prometheus.yaml",
                         "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090"],
                "ports": [{"name": "web", "containerPort": 9090}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                              "limits": {"memory": "512Mi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                                 {"name": "data", "mountPath": "/prometheus"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": "prometheus"}},
                        {"name": "data", "emptyDir": {}}],
        },
    })
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "prometheus", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": role},
         "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prometheus", "namespace": ns},
         "data": {"prometheus.yaml": _config(), "frota.rules.yaml": RULES.read_text()}},
        pod,
    ]


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster) -> Iterator[httpx.Client]:
    """A Prometheus pod in a namespace of its own; an HTTP client on its API."""
    if not PROMETHEUS.exists():
        pytest.skip(NO_PROMTOOL)
    image = _prometheus_image(cluster)
    with fleet.fresh_namespace(cluster) as ns:
        cluster.kubectl("label", "namespace", ns, "frota.dev/monitoring=true")
        objects = _objects(ns, image)
        try:
            for obj in objects:
                cluster.apply(obj, namespace=ns if obj["kind"] not in (
                    "ClusterRole", "ClusterRoleBinding") else None)
            wait_until("the Prometheus pod to be Ready", lambda: pod_is_ready(
                cluster.get("pod", "prometheus", ns)), timeout=120)
            with cluster.reach(ns, "prometheus", 9090) as (host, port), httpx.Client(
                    base_url=f"http://{host}:{port}/api/v1", timeout=30) as client:
                yield client
        finally:
            for obj in objects[1:3]:
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"],
                                "--wait=false", check=False)


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str) -> str:
    """A disaggregated fleet that admits one request at a time and queues one more."""
    cluster.kubectl("label", "namespace", ns, "frota.dev/monitoring=true")
    body = fleet.small_isvc(
        NAME, disaggregation={"minPromptTokens": 0, "prefill": {"replicas": 1},
                              "decode": {"replicas": 1}},
        router={"policy": "least-load", "admission": {"maxInflight": 1, "maxQueue": 1}})
    cluster.apply(body, namespace=ns)
    wait_ready(cluster, ns, NAME)
    return NAME


def query(prom: httpx.Client, expr: str) -> list[dict[str, Any]]:
    answer = prom.get("/query", params={"query": expr})
    assert answer.status_code == 200, f"{expr}: {answer.text}"
    return answer.json()["data"]["result"]


def _send_load(client: openai.OpenAI) -> int:
    """Streams of one repeated prompt (TTFT, ITL, prefix-cache hits), then a burst of six
    past the admission limit: one runs, one waits, the rest get 429. Returns the 429s."""
    for _ in range(3):
        stream = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
            temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def one(_: int) -> str:
        try:
            return chat(client, PROMPT)
        except openai.RateLimitError:
            return "429"

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    return answers.count("429")


def _targets_up(prom: httpx.Client, ns: str) -> set[str]:
    found = query(prom, f'up{{namespace=~"{ns}|{fleet.OPERATOR_NS}"}} == 1')
    return {s["metric"].get("role") or s["metric"]["job"] for s in found}


def test_every_panel_and_alert_returns_data_from_a_scraped_fleet(
        cluster: Cluster, ns: str, isvc: str, prometheus: httpx.Client) -> None:
    wanted = {"router", "prefill", "decode", "frota-operator-metrics"}
    wait_until("Prometheus scraping the router, both worker roles and the operator",
               lambda: wanted <= _targets_up(prometheus, ns), timeout=120)
    with router_client(cluster, ns, isvc) as client:
        # Twice, a scrape apart: a counter's first sample starts its series, so only the
        # second round shows in rate() and increase().
        rejected = [_send_load(client)]
        wait_until("the first round scraped", lambda: query(
            prometheus, f'frota_router_rejections_total{{namespace="{ns}"}}'), timeout=60)
        rejected.append(_send_load(client))
    assert min(rejected) >= 1, rejected  # each burst went past maxInflight 1 + maxQueue 1
    # The per-fleet operator series name the fleet's namespace (the ServiceMonitor's
    # honorLabels), and the fleet is Ready.
    ready = query(prometheus, f'frota_operator_inferenceservice_ready{{namespace="{ns}", name="{isvc}"}}')
    assert [s["value"][1] for s in ready] == ["1"], ready
    wait_until("two scrapes after the load", lambda: query(
        prometheus, f'count_over_time(frota_router_rejections_total{{namespace="{ns}"}}'
        f"[{RATE_INTERVAL}]) >= 3"), timeout=60)

    empty, evaluated = [], []
    for path in DASHBOARDS:
        for panel in yaml.safe_load(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = (target["expr"].replace("$__rate_interval", RATE_INTERVAL)
                        .replace("$namespace", ns).replace("$instance", isvc))
                found = query(prometheus, expr)
                evaluated.append(f"{path.name}, {panel['title']!r}: {len(found)} series, "
                                 f"e.g. {found[0]['value'][1] if found else None}")
                if not found:
                    empty.append(f"{path.name}, panel {panel['title']!r}: {expr}")
    rules = yaml.safe_load(RULES.read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        expr = _THRESHOLD.sub("", rule["expr"])
        found = query(prometheus, expr)
        evaluated.append(f"alert {rule['alert']}: {len(found)} series")
        if not found:
            empty.append(f"alert {rule['alert']}: {expr}")
    print("\n".join(evaluated))
    assert not empty, "no data for:\n" + "\n".join(empty)
    assert len(evaluated) == 8 + sum(len(p.get("targets", [])) for d in DASHBOARDS
                                     for p in yaml.safe_load(d.read_text())["panels"])
    # The rules loaded, and none fires for this fleet (those with a `for` are pending at most).
    groups = prometheus.get("/rules").json()["data"]["groups"]
    assert sum(len(g["rules"]) for g in groups) == 8, groups
    firing = [a for a in prometheus.get("/alerts").json()["data"]["alerts"]
              if a["state"] == "firing" and a["labels"].get("namespace") == ns]
    assert not firing, firing
