"""scrape.yaml's PodMonitor and ServiceMonitor as plain Prometheus scrape configs (Kubernetes
service discovery), relabelled as the Prometheus Operator does: for a Prometheus that runs
without the operator, and for the e2e test, so the selectors are written once.

    python manifests/monitoring/scrape.py     # prints the scrape_configs as YAML

Covers what scrape.yaml uses: matchLabels, matchExpressions with In, namespaceSelector
any or matchNames, port, path, interval, honorLabels and relabelings.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
MONITORS = HERE / "scrape.yaml"


def _meta(prefix: str, label: str) -> str:
    """The service-discovery label of a Kubernetes label: every non-alphanumeric becomes _."""
    return f"{prefix}_label_{re.sub(r'[^a-zA-Z0-9_]', '_', label)}"


def _selector(prefix: str, selector: dict[str, Any]) -> list[dict[str, Any]]:
    keep: list[dict[str, Any]] = []
    for key, value in (selector.get("matchLabels") or {}).items():
        keep.append({"source_labels": [_meta(prefix, key)], "regex": re.escape(value),
                     "action": "keep"})
    for expr in selector.get("matchExpressions") or []:
        if expr["operator"] != "In":
            raise ValueError(f"scrape.py renders matchExpressions with In only, not {expr}")
        keep.append({"source_labels": [_meta(prefix, expr["key"])],
                     "regex": "|".join(re.escape(v) for v in expr["values"]), "action": "keep"})
    return keep


def _relabelings(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{names.get(k, k): v for k, v in r.items()} for r in relabelings]


def _namespaces(monitor: dict[str, Any]) -> dict[str, Any]:
    selector = monitor["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return {}
    names = selector.get("matchNames") or [monitor["metadata"].get("namespace", "default")]
    return {"namespaces": {"names": names}}


def pod_monitor(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    name, spec = monitor["metadata"]["name"], monitor["spec"]
    prefix = "__meta_kubernetes_pod"
    configs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabel = [
            *_selector(prefix, spec["selector"]),
            {"source_labels": [f"{prefix}_container_port_name"],
             "regex": re.escape(endpoint["port"]), "action": "keep"},
            {"source_labels": [f"{prefix}_phase"], "regex": "Succeeded|Failed", "action": "drop"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": [f"{prefix}_name"], "target_label": "pod"},
            {"source_labels": [f"{prefix}_container_name"], "target_label": "container"},
            {"target_label": "job", "replacement": name},
            *_relabelings(endpoint.get("relabelings") or []),
        ]
        configs.append({
            "job_name": f"podMonitor/{name}/{i}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "scrape_interval": endpoint.get("interval", "30s"),
            "kubernetes_sd_configs": [{"role": "pod", **_namespaces(monitor)}],
            "relabel_configs": relabel,
        })
    return configs


def service_monitor(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    name, spec = monitor["metadata"]["name"], monitor["spec"]
    configs = []
    for i, endpoint in enumerate(spec["endpoints"]):
        relabel = [
            *_selector("__meta_kubernetes_service", spec["selector"]),
            {"source_labels": ["__meta_kubernetes_endpointslice_port_name"],
             "regex": re.escape(endpoint["port"]), "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            *_relabelings(endpoint.get("relabelings") or []),
        ]
        configs.append({
            "job_name": f"serviceMonitor/{name}/{i}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "scrape_interval": endpoint.get("interval", "30s"),
            "kubernetes_sd_configs": [{"role": "endpointslice", **_namespaces(monitor)}],
            "relabel_configs": relabel,
        })
    return configs


def scrape_configs(path: Path = MONITORS, **interval: str) -> list[dict[str, Any]]:
    """Every monitor in `path` as scrape configs; `scrape_interval=` overrides theirs."""
    configs: list[dict[str, Any]] = []
    for monitor in yaml.safe_load_all(path.read_text()):
        render = {"PodMonitor": pod_monitor, "ServiceMonitor": service_monitor}[monitor["kind"]]
        configs.extend(render(monitor))
    for config in configs:
        config.update(interval)
    return configs


if __name__ == "__main__":
    yaml.safe_dump({"scrape_configs": scrape_configs()}, sys.stdout, sort_keys=False)
