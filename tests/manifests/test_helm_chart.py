"""charts/frota: lint, the same objects as the kustomize overlays, values that do what they
say, a schema that refuses bad values, and copies of the CRDs and monitoring files that
match their sources."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from e2e.apiserver import find_binaries
from frota.operator.builders import build_children
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "frota"
HELM_VERSION = "v4.3.2"
CACHE = Path(os.environ.get("FROTA_E2E_CACHE", Path.home() / ".cache/frota-e2e"))
HELM = CACHE / "bin" / f"helm-{HELM_VERSION}" / "helm"
NO_HELM = "no cached helm binary (build it with e2e/cluster/helm.sh)"
needs_helm = pytest.mark.skipif(not HELM.exists(), reason=NO_HELM)
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def kubectl() -> str | None:
    bins = find_binaries()
    return str(bins / "kubectl") if bins else shutil.which("kubectl")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {out.stderr}")
    return out


def template(*args: str, chart: Path = CHART, namespace: str = "frota-system") -> list[dict[str, Any]]:
    out = helm("template", "frota", str(chart), "-n", namespace, *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = by_kind(objs, kind)
    return obj


def args_of(objs: list[dict[str, Any]]) -> list[str]:
    return one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}


def test_chart_copies_match_their_sources():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync-chart.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@needs_helm
def test_helm_lint_strict_passes_with_defaults_and_production_values():
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), "-f", str(CHART / "ci" / "production-values.yaml"))


@needs_helm
@pytest.mark.parametrize(("overlay", "values"), [
    ("production", ["-f", str(CHART / "ci" / "production-values.yaml")]),
    ("dev", ["--set", "namespaceOverride=frota-system,namespace.create=true,logLevel=debug",
             "--set", "image.repository=frota-operator,image.tag=dev,resources.requests.cpu=50m"]),
])
def test_chart_renders_exactly_the_objects_of_the_overlay(overlay: str, values: list[str]):
    binary = kubectl()
    if binary is None:
        pytest.skip("no cached Kubernetes binaries (build them with e2e/cluster/build.sh)")
    out = subprocess.run([binary, "kustomize", str(ROOT / "manifests" / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True)
    want = keyed([d for d in yaml.safe_load_all(out.stdout) if d])
    # The release lives elsewhere; the chart creates the operator's namespace, as kustomize does.
    got = keyed(template("--include-crds", *values, namespace="default"))
    assert sorted(got) == sorted(want)
    for key, obj in want.items():
        assert got[key] == obj, key


@needs_helm
def test_defaults_put_one_recreated_replica_in_the_release_namespace_without_a_pdb():
    objs = template(namespace="llm-ops")
    assert not by_kind(objs, "Namespace") and not by_kind(objs, "PodDisruptionBudget")
    assert not [o for o in objs if o["kind"] in MONITORING_KINDS or o["kind"] == "ConfigMap"]
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    for obj in objs:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "llm-ops", obj["kind"]
    for binding in by_kind(objs, "RoleBinding") + by_kind(objs, "ClusterRoleBinding"):
        assert binding["subjects"][0]["namespace"] == "llm-ops"
    assert args_of(objs) == ["operator", "--all-namespaces", "--peering", "frota",
                             "--liveness", "http://0.0.0.0:8080/healthz"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/frota-dev/frota-operator:{chart['appVersion']}"


@needs_helm
def test_replicas_above_one_roll_one_at_a_time_under_a_pdb():
    objs = template("--set", "replicaCount=3")
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 3
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    assert not by_kind(template("--set", "replicaCount=3,podDisruptionBudget.enabled=false"),
                       "PodDisruptionBudget")


@needs_helm
def test_more_than_one_replica_without_leader_election_is_refused():
    assert "--standalone" in args_of(template("--set", "leaderElection.enabled=false"))
    out = helm("template", "frota", str(CHART), "--set", "replicaCount=2,leaderElection.enabled=false",
               check=False)
    assert out.returncode != 0 and "needs leaderElection.enabled=true" in out.stderr


@needs_helm
def test_watched_namespaces_log_level_and_peering_reach_the_operators_args():
    args = args_of(template("--set", "watchNamespaces={team-a,team-*},logLevel=debug",
                            "--set", "leaderElection.peeringName=frota-teams"))
    assert args == ["operator", "--namespace", "team-a", "--namespace", "team-*",
                    "--peering", "frota-teams", "--liveness", "http://0.0.0.0:8080/healthz", "--verbose"]


@needs_helm
def test_pod_placement_pull_secrets_and_image_values_reach_the_pod():
    values = {
        "image": {"repository": "registry.example/frota-operator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"node-role/ops": "true"},
        "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    }
    objs = template("--set-json", f"image={json.dumps(values['image'])}",
                    *[a for k in list(values)[1:] for a in ("--set-json", f"{k}={json.dumps(values[k])}")])
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/frota-operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == values["resources"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert pod[key] == values[key], key


@needs_helm
def test_common_labels_reach_every_object_but_no_selector():
    objs = template("--set", "commonLabels.team=ml,podLabels.tier=ops,podAnnotations.owner=sre",
                    "--set", "serviceAccount.annotations.iam=role-x,monitoring.podMonitor.enabled=true",
                    "--set", "namespaceOverride=frota-system,namespace.create=true", namespace="default")
    for obj in objs:
        assert obj["metadata"]["labels"]["team"] == "ml", obj["kind"]
    deploy = one(objs, "Deployment")
    assert "team" not in deploy["spec"]["selector"]["matchLabels"]
    assert deploy["spec"]["template"]["metadata"]["labels"]["tier"] == "ops"
    assert deploy["spec"]["template"]["metadata"]["annotations"] == {"owner": "sre"}
    assert one(objs, "ServiceAccount")["metadata"]["annotations"] == {"iam": "role-x"}
    assert "team" not in one(objs, "Service")["spec"]["selector"]


@needs_helm
def test_rendered_objects_are_valid_kubernetes_objects():
    objs = template("-f", str(CHART / "ci" / "production-values.yaml"),
                    "--set", "watchNamespaces={a},imagePullSecrets[0].name=x,nodeSelector.a=b")
    for obj in objs:
        for version in ("1.33.0", "1.34.0"):
            kubernetes_validate.validate(obj, version, strict=True)


@needs_helm
def test_pod_monitor_selects_the_fleets_pods_and_service_monitor_the_operator():
    assert not [o for o in template() if o["kind"] in MONITORING_KINDS]
    objs = template("--set", "monitoring.podMonitor.enabled=true,monitoring.podMonitor.labels.release=kps",
                    "--set", "monitoring.podMonitor.interval=1m,commonLabels.team=ml")
    service_monitor, pod_monitor = one(objs, "ServiceMonitor"), one(objs, "PodMonitor")
    for monitor in (service_monitor, pod_monitor):
        assert monitor["metadata"]["namespace"] == "frota-system"
        assert {"release": "kps", "team": "ml"}.items() <= monitor["metadata"]["labels"].items()
    # The operator's metrics Service, by its labels and port name.
    service = one(objs, "Service")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["interval"] == "1m"
    # Every router and worker pod the builders render, colocated and disaggregated, by its
    # labels and the port its /metrics is served on.
    selector = pod_monitor["spec"]["selector"]
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "1m"
    roles = set()
    for isvc in (Spec().build(), Spec().disaggregated().build()):
        for child in build_children(isvc, plan(isvc)):
            if child["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = child["spec"]["template"]
            labels = pod["metadata"]["labels"]
            assert selector["matchLabels"].items() <= labels.items(), child["metadata"]["name"]
            (expression,) = selector["matchExpressions"]
            assert expression["operator"] == "In" and labels[expression["key"]] in expression["values"]
            roles.add(labels[expression["key"]])
            ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            assert endpoint["port"] in ports
    assert roles == {"router", "worker", "prefill", "decode"}


@needs_helm
def test_monitoring_objects_render_from_the_files_the_chart_holds(tmp_path: Path):
    chart = tmp_path / "frota"
    shutil.copytree(CHART, chart)
    shutil.rmtree(chart / "files")
    on = ["--set", "monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true",
          "--set", "monitoring.podMonitor.enabled=true"]
    # Without files, the switches render nothing (rather than empty or invalid objects).
    assert not [o for o in template(*on, chart=chart) if o["kind"] in MONITORING_KINDS | {"ConfigMap"}]
    rules = {"groups": [{"name": "frota", "rules": [{
        "alert": "FrotaX", "expr": "up == 0", "for": "5m",
        "annotations": {"summary": "{{ $labels.pod }} is down"}}]}]}
    (chart / "files" / "rules").mkdir(parents=True)
    (chart / "files" / "rules" / "frota.rules.yaml").write_text(yaml.safe_dump(rules))
    dashboard = {"title": "Frota fleet", "panels": [{"targets": [{"expr": "sum(up)", "legendFormat": "{{pod}}"}]}]}
    (chart / "files" / "dashboards").mkdir(parents=True)
    (chart / "files" / "dashboards" / "fleet.json").write_text(json.dumps(dashboard, indent=2))
    shutil.copy(CHART / "files" / "scrape.yaml", chart / "files" / "scrape.yaml")
    assert not [o for o in template(chart=chart) if o["kind"] in MONITORING_KINDS | {"ConfigMap"}]
    objs = template(*on, "--set", "monitoring.dashboards.namespace=grafana", chart=chart)
    assert one(objs, "PrometheusRule")["spec"] == rules
    config_map = one(objs, "ConfigMap")
    assert config_map["metadata"]["name"] == "frota-dashboard-fleet"
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["fleet.json"]) == dashboard
    # The monitors are scrape.yaml's, in the operator's namespace.
    sources = {d["kind"]: d for d in yaml.safe_load_all((CHART / "files" / "scrape.yaml").read_text()) if d}
    for kind in ("PodMonitor", "ServiceMonitor"):
        assert one(objs, kind)["spec"] == sources[kind]["spec"]


@needs_helm
def test_the_chart_renders_the_monitoring_files_it_ships():
    objs = template("--set", "monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true",
                    "--set", "monitoring.podMonitor.enabled=true")
    rules = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "files" / "rules").glob("*.yaml"))]
    if rules:
        assert one(objs, "PrometheusRule")["spec"]["groups"] == [g for r in rules for g in r["groups"]]
    dashboards = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert len(by_kind(objs, "ConfigMap")) == len(dashboards)
    if (CHART / "files" / "scrape.yaml").exists():
        assert by_kind(objs, "PodMonitor") and by_kind(objs, "ServiceMonitor")


@needs_helm
def test_runbook_base_url_points_every_alert_at_its_section_there():
    base = "https://docs.example.com/frota/operations.md"
    shipped = template("--set", "monitoring.prometheusRule.enabled=true")
    linked = template("--set", "monitoring.prometheusRule.enabled=true",
                      "--set", f"monitoring.prometheusRule.runbookBaseURL={base}/")
    pairs = [(a, b) for g, h in zip(one(shipped, "PrometheusRule")["spec"]["groups"],
                                    one(linked, "PrometheusRule")["spec"]["groups"], strict=True)
             for a, b in zip(g["rules"], h["rules"], strict=True) if "alert" in a]
    assert pairs
    for plain, based in pairs:
        anchor = plain["annotations"]["runbook_url"].split("#")[1]
        assert based["annotations"]["runbook_url"] == f"{base}#{anchor}", based["alert"]
        assert {**based, "annotations": plain["annotations"]} == plain  # nothing else moved


@needs_helm
@pytest.mark.parametrize("bad", [
    "monitoring.prometheusRule.runbookBaseURL=docs.example.com",
    "replicaCount=0", "logLevel=loud", "image.pullPolicy=Sometimes", "replicas=2",
    "monitoring.podMonitor.interval=soon", "podDisruptionBudget.minAvailable=half",
])
def test_values_schema_refuses_a_bad_value(bad: str):
    out = helm("template", "frota", str(CHART), "--set", bad, check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr
