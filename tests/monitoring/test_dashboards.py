"""The Grafana dashboards: what gen/ (Grafana's Foundation SDK) writes, valid against the SDK's
dashboard schema, with the template variables the fleet overview needs, and every query on
metric names Frota exports. The alerts' expressions are held to the same names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.exported import exported_names, metric_names
from tests.monitoring.promtools import MONITORING

DASHBOARDS = MONITORING / "dashboards"
GEN = DASHBOARDS / "gen"
BOARDS = ("fleet.json", "operator.json")
GO = shutil.which("go")
needs_go = pytest.mark.skipif(GO is None, reason="Go is not on PATH (gen/ builds with Go >= 1.24)")


def board(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def queries(name: str) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in board(name)["panels"] for t in p.get("targets", [])]


def go(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    return subprocess.run([str(GO), *args], capture_output=True, text=True, cwd=GEN, env=env,
                          timeout=600)


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (namespace, le) (rate(frota_router_ttft_bucket'
            '{namespace=~"$namespace", status!~"2.."}[$__rate_interval]))) / on(pod) '
            'vllm:kv_cache_usage_perc > 0.5')
    assert metric_names(expr) == {"frota_router_ttft_bucket", "vllm:kv_cache_usage_perc"}


def test_every_panel_queries_metrics_frota_exports() -> None:
    exported = exported_names()
    assert "frota_router_disagg_requests_total" in exported and "vllm:prompt_tokens_total" in exported
    for name in BOARDS:
        found = queries(name)
        assert found, name
        for title, expr in found:
            unknown = metric_names(expr) - exported
            assert not unknown, f"{name}, panel {title!r}: no component exports {unknown}"


def test_every_alert_reads_metrics_frota_exports() -> None:
    exported = exported_names()
    rules = yaml.safe_load((MONITORING / "rules" / "frota.rules.yaml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        unknown = metric_names(rule["expr"]) - exported
        assert not unknown, f"{rule.get('alert')}: no component exports {unknown}"


def test_the_fleet_overview_has_namespace_and_instance_variables_and_every_panel_subject() -> None:
    fleet = board("fleet.json")
    assert [v["name"] for v in fleet["templating"]["list"]] == ["datasource", "namespace", "instance"]
    exprs = " ".join(e for _, e in queries("fleet.json"))
    for needed in ("frota_router_requests_total", "frota_router_time_to_first_token_seconds",
                   "frota_router_inter_token_latency_seconds", "vllm:generation_tokens_total",
                   "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
                   "frota_router_rejections_total", "vllm:prefix_cache_hits_total",
                   "frota_router_disagg_requests_total", "count by (role)"):
        assert needed in exprs, needed
    for title, expr in queries("fleet.json"):
        assert '$namespace' in expr and '$instance' in expr, title
    operator = " ".join(e for _, e in queries("operator.json"))
    assert "frota_operator_reconciles_total" in operator
    assert "frota_operator_reconcile_duration_seconds_bucket" in operator


@needs_go
def test_the_dashboards_are_what_gen_writes(tmp_path: Path) -> None:
    out = go("run", ".", "-out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for name in BOARDS:
        assert (tmp_path / name).read_text() == (DASHBOARDS / name).read_text(), (
            f"{name} is stale: cd manifests/monitoring/dashboards/gen && go run . -out ..")


@needs_go
def test_the_dashboards_pass_the_sdk_schema_and_a_broken_one_does_not(tmp_path: Path) -> None:
    broken = board("fleet.json")
    broken["panels"][1]["gridPos"] = "top left"
    del broken["schemaVersion"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    out = go("run", ".", "-check", *(str(DASHBOARDS / n) for n in BOARDS), str(tmp_path / "broken.json"))
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["ok", "ok"], out.stdout + out.stderr
    assert lines[2].startswith("FAIL") and "schemaVersion" in out.stdout, out.stdout
    assert out.returncode == 1
