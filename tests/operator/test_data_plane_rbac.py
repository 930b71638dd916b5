"""No data-plane pod can write what changes what runs: its InferenceService (or anything of
frota.dev), a Secret, a workload or RBAC.

The router faces clients; workers run model code; the model-cache Job downloads from the
internet. Whoever takes one over gets its ServiceAccount's rights, so every sample is
rendered as `frota render` renders it (as is, with scale to zero, and with the model cache,
the variants that add RBAC or pods), and every Role or ClusterRole bound to a pod's
ServiceAccount is read. A pod whose ServiceAccount is bound to nothing must not mount a token.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from frota.api.yamlio import read_all
from frota.operator.render import render
from frota.plan.validation import inference_services

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
NAMESPACE = "llm"

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "*",
                         # as good as a write: grant, or act as, someone who can
                         "escalate", "bind", "impersonate"})
# API group -> resources no data-plane pod may write ("*": every resource of the group).
PROTECTED: dict[str, frozenset[str]] = {
    "frota.dev": frozenset({"*"}),
    "": frozenset({"secrets", "pods", "serviceaccounts", "replicationcontrollers"}),
    "apps": frozenset({"deployments", "statefulsets", "replicasets", "daemonsets"}),
    "batch": frozenset({"jobs", "cronjobs"}),
    "rbac.authorization.k8s.io": frozenset({"roles", "rolebindings", "clusterroles",
                                            "clusterrolebindings"}),
}
POD_OWNERS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def _scale_to_zero(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    autoscaling = spec.get("autoscaling") or {"maxReplicas": 2, "target": 4}
    spec["autoscaling"] = {**autoscaling, "minReplicas": 0, "scaleToZero": {}}
    return doc


def _model_cache(doc: dict[str, Any]) -> dict[str, Any]:
    doc["spec"]["model"] = {**doc["spec"]["model"], "uri": "hf://org/repo",
                            "cache": {"enabled": True}}
    return doc


VARIANTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "as-is": lambda doc: doc, "scale-to-zero": _scale_to_zero, "model-cache": _model_cache}


def rendered(path: Path, variant: str) -> list[dict[str, Any]]:
    """The children `frota render -n llm PATH` prints, of the sample changed by `variant`."""
    docs = [VARIANTS[variant](copy.deepcopy(d)) for d in read_all(str(path))
            if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    objects: list[dict[str, Any]] = []
    for isvc in inference_services(docs, NAMESPACE):
        objects += render(isvc)[1]
    return objects


def pod_specs(objects: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(owner kind/name, pod spec) of every pod the objects make."""
    out = []
    for obj in objects:
        if obj["kind"] == "Pod":
            out.append((f"Pod/{obj['metadata']['name']}", obj["spec"]))
        elif obj["kind"] in POD_OWNERS:
            out.append((f"{obj['kind']}/{obj['metadata']['name']}",
                        obj["spec"]["template"]["spec"]))
        elif obj["kind"] == "CronJob":
            out.append((f"CronJob/{obj['metadata']['name']}",
                        obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return out


def _namespace(obj: dict[str, Any]) -> str:
    return obj["metadata"].get("namespace") or NAMESPACE


def bound_roles(objects: list[dict[str, Any]], account: str,
                namespace: str) -> list[dict[str, Any]]:
    """Every Role and ClusterRole a binding among `objects` grants the ServiceAccount; a
    binding to a role the objects do not hold fails (its rules could not be checked)."""
    roles = {(o["kind"], _namespace(o) if o["kind"] == "Role" else "", o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    out = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace", _namespace(binding)) == namespace
                   for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        scope = _namespace(binding) if ref["kind"] == "Role" else ""
        role = roles.get((ref["kind"], scope, ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds {ref}, which is not rendered"
        out.append(role)
    return out


def forbidden_grants(role: dict[str, Any]) -> list[str]:
    """What `role` lets its holder write that a data-plane pod must not: wildcards anywhere,
    writes to protected resources (subresources included), and writes not named by
    resourceNames."""
    found = []
    for rule in role.get("rules") or []:
        where = f"{role['kind']}/{role['metadata']['name']}: {rule}"
        groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
        verbs = set(rule.get("verbs") or [])
        if "*" in groups or "*" in resources or "*" in verbs or rule.get("nonResourceURLs"):
            found.append(f"a wildcard or non-resource URL: {where}")
            continue
        writes = verbs & WRITE_VERBS
        if not writes:
            continue
        for group in groups:
            protected = PROTECTED.get(group, frozenset())
            for resource in resources:
                base = resource.split("/")[0]  # pods/exec is a write to pods
                if "*" in protected or base in protected:
                    found.append(f"{sorted(writes)} on {group or 'core'}/{resource}: {where}")
        if not rule.get("resourceNames"):
            found.append(f"{sorted(writes)} not limited to named objects: {where}")
    return found


def service_accounts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}


CASES = [(path, variant) for path in SAMPLES for variant in VARIANTS]


@pytest.fixture(params=CASES, ids=[f"{p.stem}-{v}" for p, v in CASES])
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """What `frota render` prints for one sample in one variant."""
    path, variant = request.param
    return rendered(path, variant)


def test_no_data_plane_pod_can_write_its_fleet_secrets_workloads_or_rbac(
        objects: list[dict[str, Any]]) -> None:
    pods = pod_specs(objects)
    assert pods, "the sample renders no pod"
    problems = []
    for owner, pod in pods:
        account = pod.get("serviceAccountName") or "default"
        for role in bound_roles(objects, account, NAMESPACE):
            problems += [f"{owner} ({account}): {p}" for p in forbidden_grants(role)]
    assert not problems, "\n".join(problems)


def test_only_pods_that_call_the_api_mount_a_service_account_token(
        objects: list[dict[str, Any]]) -> None:
    accounts = service_accounts(objects)
    callers = 0
    for owner, pod in pod_specs(objects):
        account = pod.get("serviceAccountName") or "default"
        automount = pod.get("automountServiceAccountToken",
                            accounts.get(account, {}).get("automountServiceAccountToken", True))
        if bound_roles(objects, account, NAMESPACE):
            callers += 1  # the router: it reads EndpointSlices (and stamps its demand)
        else:
            assert automount is False, f"{owner} mounts a token it has no use for"
    assert callers, "no pod calls the API: the RBAC check above had nothing to read"


def test_the_scale_to_zero_router_writes_only_its_demand_configmap() -> None:
    objects = rendered(SAMPLES[0], "scale-to-zero")
    (router,) = [spec for owner, spec in pod_specs(objects) if owner.endswith("-router")]
    roles = bound_roles(objects, router["serviceAccountName"], NAMESPACE)
    writes = [(rule["resources"], rule.get("resourceNames"), rule["verbs"])
              for role in roles for rule in role["rules"] if set(rule["verbs"]) & WRITE_VERBS]
    (demand,) = [o for o in objects if o["kind"] == "ConfigMap"
                 and o["metadata"]["labels"].get("app.kubernetes.io/component") == "demand"]
    assert writes == [(["configmaps"], [demand["metadata"]["name"]], ["patch"])]


@pytest.mark.parametrize(("rule", "why"), [
    ({"apiGroups": ["frota.dev"], "resources": ["inferenceservices"],
      "resourceNames": ["tiny"], "verbs": ["patch"]}, "frota.dev/inferenceservices"),
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"]}, "core/secrets"),
    ({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}, "core/pods/exec"),
    ({"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["patch"]}, "apps/statefulsets"),
    ({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
     "roles"),
    ({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}, "wildcard"),
    ({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}, "named objects"),
])
def test_the_check_catches_each_kind_of_forbidden_grant(rule: dict[str, Any], why: str) -> None:
    role = {"kind": "Role", "metadata": {"name": "bad"}, "rules": [rule]}
    problems = forbidden_grants(role)
    assert any(why in problem for problem in problems), problems


def test_the_check_lets_reads_and_one_named_write_through() -> None:
    role = {"kind": "Role", "metadata": {"name": "router"}, "rules": [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["tiny-demand"],
         "verbs": ["patch"]}]}
    assert forbidden_grants(role) == []
