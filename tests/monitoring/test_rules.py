"""The alert rules: one source for both files, each alert documented, and promtool's checks and
unit tests (manifests/monitoring/tests/) passing, one test per alert that fires and stays
silent."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs.markdown import anchor
from tests.monitoring.promtools import MONITORING, PROMTOOL, ROOT, needs_promtool

RULES = MONITORING / "rules" / "frota.rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheus-rules.yaml"
UNIT_TESTS = MONITORING / "tests" / "frota.rules.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


def alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            if "alert" in r]


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=MONITORING)


def test_both_rule_files_are_what_rules_py_writes(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(MONITORING / "rules.py"), "--out", str(tmp_path)],
                   check=True, timeout=60)
    for written in (RULES, PROMETHEUS_RULE):
        fresh = tmp_path / written.relative_to(MONITORING)
        assert fresh.read_text() == written.read_text(), (
            f"{written} is stale: run python manifests/monitoring/rules.py")


def test_the_prometheus_rule_holds_exactly_the_plain_rule_file() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_a_threshold_is_a_parameter(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(MONITORING / "rules.py"), "--out", str(tmp_path),
                    "--ttft-slo-seconds", "0.75"], check=True, timeout=60)
    written = yaml.safe_load((tmp_path / "rules" / "frota.rules.yaml").read_text())
    ttft = next(r for r in written["groups"][0]["rules"]
                if r["alert"] == "FrotaTimeToFirstTokenHigh")
    assert ttft["expr"].endswith("> 0.75")


def test_every_alert_has_severity_summary_description_and_a_runbook_that_exists() -> None:
    anchors = {anchor(line.lstrip("#").strip()) for line in OPERATIONS.read_text().splitlines()
               if line.startswith("#")}
    found = alerts()
    assert len(found) == 8
    for rule in found:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["alert"]
        page, _, fragment = notes["runbook_url"].partition("#")
        assert page == "docs/operations.md" and fragment in anchors, (
            f"{rule['alert']}: {notes['runbook_url']} names no heading of docs/operations.md")


def _labels(series: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


def test_every_alert_has_a_promtool_test_that_fires_it_beside_a_healthy_series() -> None:
    """promtool fails on any alert a case does not expect, so a series the expected alerts do
    not cover is one the alert must stay silent on."""
    for rule in alerts():
        name = rule["alert"]
        tests = [t for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
                 if any(c["alertname"] == name for c in t["alert_rule_test"])]
        firing = [a["exp_labels"] for t in tests for c in t["alert_rule_test"]
                  if c["alertname"] == name for a in c["exp_alerts"]]
        assert firing, f"{name}: no test where it fires"
        silent = [s["series"] for t in tests for s in t["input_series"]
                  if not any(_labels(s["series"]).items() >= {
                      (k, v) for k, v in a.items() if k != "severity"} for a in firing)]
        assert silent, f"{name}: no healthy series it must stay silent on"


@needs_promtool
def test_promtool_check_rules_passes_on_both_files(tmp_path: Path) -> None:
    spec = tmp_path / "from-prometheus-rule.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]))
    out = promtool("check", "rules", RULES, spec)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout, out.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    out = promtool("test", "rules", UNIT_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_tests_fail_when_an_alert_never_fires(tmp_path: Path) -> None:
    """The unit tests can fail: with one threshold out of reach, its firing case does."""
    subprocess.run([sys.executable, str(MONITORING / "rules.py"), "--out", str(tmp_path),
                    "--kv-cache-full-ratio", "1.5"], check=True, timeout=60)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / UNIT_TESTS.name).write_text(UNIT_TESTS.read_text())
    out = subprocess.run([str(PROMTOOL), "test", "rules", f"tests/{UNIT_TESTS.name}"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert "alertname: FrotaKVCacheNearFull" in out.stdout + out.stderr
    assert "alertname: FrotaFleetNotReady" not in out.stdout + out.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
