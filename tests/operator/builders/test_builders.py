"""The builders: the child objects' fields that matter, and their validity for Kubernetes."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from frota.api import InferenceService
from frota.operator.builders import build_children
from frota.operator.render import planned_status
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

SAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "samples").glob("*.yaml"))
KUBERNETES_VERSIONS = ["1.33.0", "1.34.0", "1.35.0"]


def children(spec: Spec) -> list[dict]:
    isvc = spec.build()
    return build_children(isvc, plan(isvc))


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_one_statefulset_per_group_with_one_pod_per_rank():
    objs = children(Spec().replicas(2).tensor(3))
    sts = [o for o in objs if o["kind"] == "StatefulSet"]
    assert [s["metadata"]["name"] for s in sts] == ["tiny-worker-0", "tiny-worker-1"]
    spec = sts[1]["spec"]
    assert spec["replicas"] == 3
    assert spec["serviceName"] == "tiny-worker-1"
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "OnDelete"}


def test_rank_env_comes_from_the_pod_index_and_the_leaders_dns_name():
    sts = one(children(Spec().tensor(3)), "StatefulSet")
    env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    assert env["FROTA_RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    assert env["FROTA_WORLD_SIZE"] == "3"
    assert env["FROTA_MASTER_ADDR"] == "tiny-worker-0-0.tiny-worker-0"
    assert env["FROTA_MASTER_PORT"] == "29500"


def test_headless_group_service_publishes_unready_ranks():
    svc = one(children(Spec()), "Service", "tiny-worker-0")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"]["frota.dev/replica"] == "0"


def test_labels_follow_the_design_and_carry_the_revision():
    isvc = Spec().build()
    topo = plan(isvc)
    sts = one(build_children(isvc, topo), "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/name"] == "frota"
    assert pod_labels["app.kubernetes.io/instance"] == "tiny"
    assert pod_labels["frota.dev/role"] == "worker"
    assert pod_labels["frota.dev/replica"] == "0"
    assert pod_labels["frota.dev/revision"] == topo.groups[0].revision
    assert "frota.dev/revision" not in sts["spec"]["selector"]["matchLabels"]  # selectors are immutable


def test_every_child_is_owned_by_the_inferenceservice():
    for obj in children(Spec().disaggregated()):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "InferenceService"
        assert owner["name"] == "tiny"
        assert owner["controller"] is True
        assert obj["metadata"]["namespace"] == "llm"


def test_render_without_uid_has_no_owner_references():
    manifest = Spec().manifest()
    del manifest["metadata"]["uid"]
    isvc = InferenceService.from_manifest(manifest)
    assert all("ownerReferences" not in o["metadata"] for o in build_children(isvc, plan(isvc)))


def test_pods_run_locked_down():
    objs = children(Spec())
    for kind in ("StatefulSet", "Deployment"):
        pod = one(objs, kind)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_worker_probes_allow_a_long_model_load():
    container = one(children(Spec()), "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800


def test_accelerators_are_requested_by_their_resource_name():
    spec = Spec().gpu(count=2).set("spec.resources.accelerator.resourceName", "amd.com/gpu")
    pod = one(children(spec), "StatefulSet")["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["amd.com/gpu"] == 2
    assert resources["limits"]["amd.com/gpu"] == 2
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])


def test_cpu_fleet_requests_no_accelerator():
    resources = one(children(Spec()), "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "2", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}


def test_pvc_models_are_mounted_read_only():
    pod = one(children(Spec(uri="pvc://weights/llama/8b")), "StatefulSet")["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    assert pod["containers"][0]["args"][2] == "/models/llama/8b"
    assert "initContainers" not in pod


def test_downloaded_models_are_fetched_by_an_init_container_into_the_cache():
    spec = Spec(uri="hf://org/repo").set("spec.model.credentials", {"name": "hf", "key": "token"})
    pod = one(children(spec), "StatefulSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["fetch", "hf://org/repo", "--dest", "/models/cache/org/repo"]
    assert env_of(init)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert pod["containers"][0]["args"][2] == "/models/cache/org/repo"


def test_a_pinned_sha256_is_enforced_by_the_fetch_without_a_cache_too():
    pin = "ab" * 32
    pod = one(children(Spec(uri="hf://org/repo").set("spec.model.sha256", pin)),
              "StatefulSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["fetch", "hf://org/repo", "--dest", "/models/cache/org/repo",
                            "--sha256", pin]


def test_router_discovers_rank_zero_endpoints_through_its_own_role():
    objs = children(Spec().disaggregated())
    deploy = one(objs, "Deployment", "tiny-router")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["router", "--discovery", "kubernetes"]
    selector = args[args.index("--selector") + 1]
    assert selector == "app.kubernetes.io/instance=tiny,frota.dev/serving=true"
    role_services = [o for o in objs if o["kind"] == "Service"
                     and o["metadata"]["labels"].get("frota.dev/serving") == "true"]
    assert sorted(s["metadata"]["name"] for s in role_services) == ["tiny-decode", "tiny-prefill"]
    for svc in role_services:
        assert svc["spec"]["selector"]["apps.kubernetes.io/pod-index"] == "0"
    role = one(objs, "Role")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    binding = one(objs, "RoleBinding")
    assert binding["subjects"][0]["name"] == deploy["spec"]["template"]["spec"]["serviceAccountName"]


def test_with_scale_to_zero_the_router_may_patch_its_demand_configmap_and_nothing_else():
    plain_objs = children(Spec().set("spec.autoscaling", {"maxReplicas": 2, "target": 1}))
    assert len(one(plain_objs, "Role")["rules"]) == 1  # autoscaling alone: EndpointSlices, read-only
    assert not [o for o in plain_objs if o["metadata"]["name"] == "tiny-demand"]
    objs = children(Spec().set("spec.autoscaling", {"minReplicas": 0, "maxReplicas": 2, "target": 1}))
    role = one(objs, "Role")
    discovery, demand = role["rules"]
    assert discovery["resources"] == ["endpointslices"]
    # The demand ConfigMap: one verb, on one object, named; never the InferenceService.
    assert demand == {"apiGroups": [""], "resources": ["configmaps"],
                      "resourceNames": ["tiny-demand"], "verbs": ["patch"]}
    kubernetes_validate.validate(role, "1.34.0", strict=True)
    configmap = one(objs, "ConfigMap", "tiny-demand")
    assert "data" not in configmap  # the router writes its key; the operator's apply never does
    assert configmap["metadata"]["labels"]["app.kubernetes.io/component"] == "demand"
    assert configmap["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    args = one(objs, "Deployment", "tiny-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--announce-demand") + 1] == "tiny-demand"
    assert args[args.index("--hold-seconds") + 1] == "120"  # scaleToZero's defaults
    assert args[args.index("--max-held-requests") + 1] == "1024"


def test_the_router_drains_as_long_as_a_worker_within_its_pod_termination_grace():
    objs = children(Spec())
    router_pod = one(objs, "Deployment", "tiny-router")["spec"]["template"]["spec"]
    container = router_pod["containers"][0]
    args = container["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    worker_pod = next(o for o in objs if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    worker_drain = float(env_of(worker_pod["containers"][0])["FROTA_SHUTDOWN_GRACE_PERIOD"])
    assert drain >= worker_drain - pre_stop > 0
    assert pre_stop + drain < router_pod["terminationGracePeriodSeconds"]
    assert worker_drain < worker_pod["terminationGracePeriodSeconds"]


def test_router_reads_the_api_key_from_a_mounted_secret_file():
    deploy = one(children(Spec().set("spec.router.apiKeySecret", {"name": "keys", "key": "k1"})), "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert env_of(container)["FROTA_API_KEY_FILE"] == "/var/run/secrets/frota/api-key/api-key"
    assert {"name": "api-key", "secret": {"secretName": "keys", "items": [{"key": "k1", "path": "api-key"}]}} \
        in pod["volumes"]
    assert all("secretKeyRef" not in str(e) for e in container["env"])


def test_network_policy_admits_only_the_router_monitoring_and_the_fleets_own_ranks():
    policy = one(children(Spec()), "NetworkPolicy")["spec"]
    workers = policy["podSelector"]
    assert workers["matchExpressions"] == [
        {"key": "frota.dev/role", "operator": "In", "values": ["worker", "prefill", "decode"]}]
    from_router, from_monitoring, from_ranks = policy["ingress"]
    assert from_monitoring == {"from": [{"namespaceSelector": {"matchLabels": {
        "frota.dev/monitoring": "true"}}}], "ports": [{"port": "http", "protocol": "TCP"}]}
    assert from_router["from"][0]["podSelector"]["matchLabels"]["frota.dev/role"] == "router"
    assert from_router["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "tiny"
    assert from_ranks["from"][0]["podSelector"] == workers
    assert "namespaceSelector" not in from_router["from"][0]


def test_network_policy_admits_the_operator_when_a_role_reads_its_workers_metrics():
    assert len(one(children(Spec().disaggregated()), "NetworkPolicy")["spec"]["ingress"]) == 3
    spec = Spec().disaggregated().set(
        "spec.disaggregation.decode.autoscaling", {"maxReplicas": 4, "target": 8})
    *_, from_operator = one(children(spec), "NetworkPolicy")["spec"]["ingress"]
    assert from_operator["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "frota", "app.kubernetes.io/component": "operator"}}}]
    assert from_operator["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_disruption_budget_per_role():
    budgets = [o for o in children(Spec().disaggregated()) if o["kind"] == "PodDisruptionBudget"]
    assert sorted(b["metadata"]["name"] for b in budgets) == ["tiny-decode", "tiny-prefill", "tiny-router"]
    assert all(b["spec"]["maxUnavailable"] == 1 for b in budgets)


def test_autoscaling_renders_no_hpa_because_the_operator_scales_itself():
    spec = Spec().set("spec.autoscaling", {"minReplicas": 1, "maxReplicas": 4, "target": 8})
    assert all(o["kind"] != "HorizontalPodAutoscaler" for o in children(spec))


def test_engine_settings_live_in_a_configmap_the_workers_load():
    objs = children(Spec().set("spec.engine.scheduler", {"maxNumSeqs": 7}))
    cm = one(objs, "ConfigMap")
    assert cm["data"]["FROTA_MAX_NUM_SEQS"] == "7"
    container = one(objs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]


def test_planned_status_reports_selector_url_and_capacity():
    isvc = Spec().build()
    status = planned_status(isvc, plan(isvc))
    assert status.url == "http://tiny.llm.svc:80/v1"
    assert "apps.kubernetes.io/pod-index=0" in status.selector
    assert status.capacity.sequencesAtMaxModelLen >= 1


def _all_sample_children() -> list[tuple[str, dict]]:
    out = []
    for path in SAMPLES:
        isvc = InferenceService.from_manifest(yaml.safe_load(path.read_text()))
        for obj in build_children(isvc, plan(isvc)):
            out.append((f"{path.stem}/{obj['kind']}/{obj['metadata']['name']}", obj))
    extra = Spec(uri="hf://org/repo").gpu().set("spec.router.apiKeySecret", {"name": "k", "key": "v"})
    extra.set("spec.placement.affinity", {"nodeAffinity": {}})
    isvc = extra.build()
    out += [(f"hf/{o['kind']}/{o['metadata']['name']}", o) for o in build_children(isvc, plan(isvc))]
    return out


CHILDREN = _all_sample_children()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_children_validate_against_the_kubernetes_schemas(version):
    failures = []
    for name, obj in CHILDREN:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{name}: {exc.message} at {list(exc.path)}")
    assert failures == []


def test_child_names_and_label_values_fit_kubernetes_limits():
    isvc = Spec(name="a" * 40).replicas(12).build()
    for obj in build_children(isvc, plan(isvc)):
        assert len(obj["metadata"]["name"]) <= 52  # StatefulSet names leave room for the revision hash
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63
