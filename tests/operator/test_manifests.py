"""manifests/: the kustomize base and overlays, least-privilege RBAC, and the Argo CD health check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from frota.operator.builders import build_children
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
KUBECTL = shutil.which("kubectl")
# kind -> (API group, resource) for everything the builders emit.
RESOURCES = {
    "ConfigMap": ("", "configmaps"), "Service": ("", "services"), "ServiceAccount": ("", "serviceaccounts"),
    "StatefulSet": ("apps", "statefulsets"), "Deployment": ("apps", "deployments"),
    "Role": ("rbac.authorization.k8s.io", "roles"), "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "PersistentVolumeClaim": ("", "persistentvolumeclaims"), "Job": ("batch", "jobs"),
}


def base_objects() -> list[dict]:
    docs = []
    for name in yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())["resources"]:
        path = MANIFESTS / "base" / name
        files = [path / "frota.dev_inferenceservices.yaml"] if path.is_dir() else [path]
        for f in files:
            docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def cluster_role() -> dict:
    return next(d for d in base_objects() if d["kind"] == "ClusterRole")


def allows(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def kustomize(overlay: str) -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(MANIFESTS / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_rbac_has_no_wildcards():
    for obj in base_objects():
        for rule in obj.get("rules", []):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{obj['kind']} {obj['metadata']['name']}: {rule}"


def test_operator_can_manage_every_child_kind_the_builders_emit():
    rules = cluster_role()["rules"]
    isvc = Spec().disaggregated().set("spec.autoscaling", {"maxReplicas": 3, "target": 4}).build()
    cached = (Spec().set("spec.model.uri", "hf://org/repo")
              .set("spec.model.cache", {"enabled": True}).build())
    kinds = {o["kind"] for o in build_children(isvc, plan(isvc))}
    kinds |= {o["kind"] for o in build_children(cached, plan(cached))}
    assert {"PersistentVolumeClaim", "Job"} <= kinds
    assert kinds <= set(RESOURCES)
    for kind in kinds:
        group, resource = RESOURCES[kind]
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert allows(rules, group, resource, verb), f"{verb} {group}/{resource}"


@pytest.mark.parametrize("spec", [
    Spec(), Spec().set("spec.autoscaling", {"minReplicas": 0, "maxReplicas": 2, "target": 1}),
], ids=["plain", "scale-to-zero"])
def test_operator_holds_every_permission_it_grants_the_router(spec: Spec):
    # RBAC escalation prevention: a Role can only grant what its creator holds.
    rules = cluster_role()["rules"]
    isvc = spec.build()
    router_role = next(o for o in build_children(isvc, plan(isvc)) if o["kind"] == "Role")
    for rule in router_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allows(rules, group, resource, verb), f"{verb} {group}/{resource}"


def test_operator_may_create_fleet_keys_but_never_read_or_change_a_secret():
    rules = cluster_role()["rules"]
    assert allows(rules, "", "secrets", "create")
    for verb in ("get", "list", "watch", "update", "patch", "delete", "deletecollection"):
        assert not allows(rules, "", "secrets", verb), verb


@pytest.mark.parametrize(("group", "resource", "verbs"), [
    ("frota.dev", "inferenceservices", ["get", "list", "watch", "patch"]),
    ("frota.dev", "inferenceservices/status", ["patch"]),
    ("frota.dev", "inferenceservices/scale", ["patch"]),
    ("", "pods", ["get", "list", "watch"]),
    ("discovery.k8s.io", "endpointslices", ["get", "list", "watch"]),
    ("", "events", ["create"]),
    ("kopf.dev", "clusterkopfpeerings", ["list", "watch", "create", "patch"]),
    ("kopf.dev", "kopfpeerings", ["list", "watch", "create", "patch"]),
    ("apiextensions.k8s.io", "customresourcedefinitions", ["list", "watch"]),
])
def test_operator_has_what_kopf_and_the_reconciler_need(group, resource, verbs):
    rules = cluster_role()["rules"]
    for verb in verbs:
        assert allows(rules, group, resource, verb)


def test_leases_are_granted_only_in_the_operators_namespace():
    role = next(d for d in base_objects() if d["kind"] == "Role")
    assert allows(role["rules"], "coordination.k8s.io", "leases", "update")
    assert not allows(cluster_role()["rules"], "coordination.k8s.io", "leases", "update")


def test_operator_deployment_is_probed_locked_down_and_sized():
    deploy = next(d for d in base_objects() if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["frota"] and container["args"][0] == "operator"
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(container)
    assert container["resources"]["requests"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "frota-operator"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (with kustomize) not installed")
@pytest.mark.parametrize("overlay", ["dev", "production"])
def test_overlays_build_into_valid_objects_in_frota_system(overlay):
    objs = kustomize(overlay)
    for obj in objs:
        if obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                           "ClusterKopfPeering"):
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == "frota-system", obj["metadata"]["name"]
        if obj["apiVersion"] != "kopf.dev/v1":
            for version in ("1.33.0", "1.34.0"):
                kubernetes_validate.validate(obj, version, strict=True)
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == (2 if overlay == "production" else 1)


def _health(obj: dict) -> dict:
    lupa = pytest.importorskip("lupa")
    lua = lupa.LuaRuntime()
    check = lua.eval("function(obj) " + (MANIFESTS / "argocd" / "health-inferenceservice.lua").read_text() + " end")
    result = check(lua.table_from(obj, recursive=True))
    return {"status": result["status"], "message": result["message"]}


def _isvc(generation: int, observed: int | None, *conditions: tuple) -> dict:
    status: dict = {"conditions": [
        {"type": t, "status": s, "reason": r, "message": "", "observedGeneration": g} for t, s, r, g in conditions
    ]}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"name": "x", "generation": generation}, "status": status}


def test_argocd_health_is_healthy_only_for_the_observed_generation():
    assert _health(_isvc(2, 2, ("Ready", "True", "AllReplicasReady", 2)))["status"] == "Healthy"
    assert _health(_isvc(3, 2, ("Ready", "True", "AllReplicasReady", 2)))["status"] == "Progressing"
    assert _health(_isvc(3, 3, ("Ready", "True", "AllReplicasReady", 2)))["status"] == "Progressing"
    assert _health({"metadata": {"generation": 1}})["status"] == "Progressing"


def test_argocd_health_reports_degraded_and_invalid_specs():
    degraded = _isvc(1, 1, ("Ready", "False", "ReplicasUnavailable", 1), ("Degraded", "True", "RankCrashLoop", 1))
    assert _health(degraded) == {"status": "Degraded", "message": "RankCrashLoop"}
    invalid = _isvc(1, 1, ("SpecValid", "False", "TensorDoesNotDivideHeads", 1))
    assert _health(invalid)["status"] == "Degraded"
    rolling = _isvc(1, 1, ("Ready", "False", "RollingOut", 1))
    assert _health(rolling)["status"] == "Progressing"


def test_argocd_configmap_patch_embeds_the_same_lua():
    patch = yaml.safe_load((MANIFESTS / "argocd" / "argocd-cm-patch.yaml").read_text())
    lua = (MANIFESTS / "argocd" / "health-inferenceservice.lua").read_text()
    assert patch["data"]["resource.customizations.health.frota.dev_InferenceService"] == lua


def test_no_custom_resource_ships_beside_its_crd():
    # One `kubectl apply -k` on a fresh cluster: an object of a CRD applied in the
    # same call fails until the CRD is established (the operator makes its peering).
    objs = base_objects()
    groups = {d["spec"]["group"] for d in objs if d["kind"] == "CustomResourceDefinition"}
    assert groups >= {"frota.dev", "kopf.dev"}
    assert not [d["kind"] for d in objs if d["apiVersion"].split("/")[0] in groups]
