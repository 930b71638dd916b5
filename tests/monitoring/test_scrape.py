"""scrape.yaml's PodMonitor and ServiceMonitor, rendered by scrape.py as plain scrape configs,
are a configuration Prometheus accepts, selecting what the chart's monitors select."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.monitoring.promtools import MONITORING, PROMTOOL, needs_promtool
from tests.monitoring.scrape_configs import scrape_configs


def test_the_fleet_monitor_keeps_routers_and_rank_zero_workers_on_the_http_port() -> None:
    pods, operator = scrape_configs()
    keeps = {tuple(r["source_labels"]): r["regex"] for r in pods["relabel_configs"]
             if r.get("action") == "keep"}
    assert keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == "frota"
    assert keeps[("__meta_kubernetes_pod_label_frota_dev_role",)] == "router|worker|prefill|decode"
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "http"
    assert keeps[("__meta_kubernetes_pod_label_apps_kubernetes_io_pod_index",)] == "0|"
    targets = {r.get("target_label") for r in pods["relabel_configs"]}
    assert {"namespace", "pod", "inferenceservice", "role"} <= targets
    assert pods["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert operator["kubernetes_sd_configs"] == [{"role": "endpointslice"}]
    assert operator["honor_labels"] is True  # the fleets' namespace on per-fleet series


@needs_promtool
def test_promtool_accepts_the_rendered_scrape_configs(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yaml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "15s"},
        "rule_files": [str(MONITORING / "rules" / "frota.rules.yaml")],
        "scrape_configs": scrape_configs(),
    }))
    out = subprocess.run([str(PROMTOOL), "check", "config", str(config)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
