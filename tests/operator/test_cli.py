"""`frota operator` wraps `kopf run` with the scope and settings given as flags."""

from __future__ import annotations

from typing import Any

import kopf
import prometheus_client
import pytest

from frota.cli.main import main


@pytest.fixture
def kopf_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    monkeypatch.setattr(prometheus_client, "start_http_server",
                        lambda port, registry: seen.update(metrics_port=port))
    return seen


def test_namespaced_run_with_peering(kopf_run: dict[str, Any]) -> None:
    assert main(["operator", "-n", "team-a", "-n", "team-b", "--peering", "frota",
                 "--metrics-port", "9191", "--liveness", "http://0.0.0.0:8080/healthz"]) == 0
    assert kopf_run["namespaces"] == ["team-a", "team-b"] and not kopf_run["clusterwide"]
    assert kopf_run["peering_name"] == "frota" and kopf_run["standalone"] is None
    assert kopf_run["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"
    assert kopf_run["metrics_port"] == 9191
    state = kopf_run["memo"]["state"]
    assert state.settings.namespaces == ("team-a", "team-b")
    assert state.settings.autoscale_interval_seconds == 15.0
    assert state.settings.capacity_report_interval_seconds == 30.0
    assert isinstance(kopf_run["registry"], kopf.OperatorRegistry)


def test_the_autoscale_interval_flag_becomes_a_setting(kopf_run: dict[str, Any]) -> None:
    assert main(["operator", "--standalone", "--metrics-port", "0", "--autoscale-interval", "3"]) == 0
    assert kopf_run["memo"]["state"].settings.autoscale_interval_seconds == 3.0


def test_the_capacity_report_interval_flag_becomes_a_setting(kopf_run: dict[str, Any]) -> None:
    assert main(["operator", "--standalone", "--metrics-port", "0",
                 "--capacity-report-interval", "7.5"]) == 0
    assert kopf_run["memo"]["state"].settings.capacity_report_interval_seconds == 7.5


def test_all_namespaces_standalone_without_metrics(kopf_run: dict[str, Any]) -> None:
    assert main(["operator", "--all-namespaces", "--standalone", "--metrics-port", "0",
                 "--liveness", ""]) == 0
    assert kopf_run["clusterwide"] and kopf_run["standalone"] is True
    assert kopf_run["liveness_endpoint"] is None and "metrics_port" not in kopf_run


def test_scope_flags_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        main(["operator", "--namespace", "a", "--all-namespaces"])
