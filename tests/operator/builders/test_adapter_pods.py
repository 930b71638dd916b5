"""LoRA adapters in the pods: each delivered as the model is (a claim mounted read-only, a
download fetched by an init container, with the model's credentials and CA bundle), the
pods still restricted, the operator let in to read them, the router told where they are."""

from __future__ import annotations

import kubernetes_validate

from frota.operator.builders import build_children
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec
from tests.plan.test_adapters_plan import ADAPTERS, PATHS, with_adapters


def pod_spec(spec: Spec) -> dict:
    isvc = spec.build()
    sts = [o for o in build_children(isvc, plan(isvc)) if o["kind"] == "StatefulSet"]
    return sts[0]["spec"]["template"]["spec"]


def test_pvc_adapters_mount_their_claim_read_only_once():
    spec = Spec().set("spec.adapters", [{"name": "a", "uri": "pvc://loras/a"}, {"name": "b", "uri": "pvc://loras/b"}])
    pod = pod_spec(spec)
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "adapters-pvc-0", "persistentVolumeClaim": {"claimName": "loras", "readOnly": True}}]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "adapters-pvc-0")
    assert mount == {"name": "adapters-pvc-0", "mountPath": "/adapters/pvc/loras", "readOnly": True}


def test_downloaded_adapters_are_fetched_as_the_model_is_into_a_directory_each():
    pod = pod_spec(with_adapters())
    fetch = [c for c in pod["initContainers"] if c["name"].startswith("fetch-adapter-")]
    assert [c["args"] for c in fetch] == [["fetch", "hf://org/chat-lora", "--dest", "/adapters/cache/chat"],
                                          ["fetch", "https://example.com/tone", "--dest", "/adapters/cache/tone"]]
    assert all(c["command"] == ["frota"] for c in fetch)
    assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in fetch)
    cache = next(v for v in pod["volumes"] if v["name"] == "adapter-cache")
    assert cache == {"name": "adapter-cache", "emptyDir": {"sizeLimit": "4096Mi"}}
    worker_mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "adapter-cache")
    assert worker_mount == {"name": "adapter-cache", "mountPath": "/adapters/cache", "readOnly": True}


def test_downloads_use_the_models_credentials():
    spec = with_adapters().set("spec.model.credentials", {"name": "hf", "key": "token"})
    fetch = next(c for c in pod_spec(spec)["initContainers"] if c["name"] == "fetch-adapter-0")
    token = next(e for e in fetch["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_a_ca_bundle_is_mounted_and_trusted_in_every_fetch_and_in_the_worker():
    spec = (with_adapters(Spec(uri="https://models.internal/smol/smol.gguf"))
            .set("spec.model.caBundle", {"name": "internal-ca"}))
    pod = pod_spec(spec)
    volume = next(v for v in pod["volumes"] if v["name"] == "ca-bundle")
    assert volume == {"name": "ca-bundle", "configMap": {
        "name": "internal-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    mount = {"name": "ca-bundle", "mountPath": "/etc/frota/ca", "readOnly": True}
    fetches = [c for c in pod["initContainers"] if c["args"][0] == "fetch"]
    assert [c["name"] for c in fetches] == ["fetch-model", "fetch-adapter-0", "fetch-adapter-1"]
    for container in [*fetches, pod["containers"][0]]:
        assert mount in container["volumeMounts"], container["name"]
        ssl_env = [e for e in container["env"] if e["name"] == "SSL_CERT_FILE"]
        assert ssl_env == [{"name": "SSL_CERT_FILE", "value": "/etc/frota/ca/ca.crt"}], container["name"]
    isvc = spec.build()
    for obj in build_children(isvc, plan(isvc)):
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_a_ca_bundle_key_other_than_ca_crt_is_mounted_as_ca_crt():
    spec = with_adapters().set("spec.model.caBundle", {"name": "corp", "key": "bundle.pem"})
    volume = next(v for v in pod_spec(spec)["volumes"] if v["name"] == "ca-bundle")
    assert volume["configMap"]["items"] == [{"key": "bundle.pem", "path": "ca.crt"}]


def test_without_a_ca_bundle_nothing_names_one():
    pod = pod_spec(with_adapters())
    assert not any(v["name"] == "ca-bundle" for v in pod["volumes"])
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert not any(e["name"] == "SSL_CERT_FILE" for e in container["env"])
        assert not any(m["name"] == "ca-bundle" for m in container["volumeMounts"])


def test_pods_with_adapters_stay_restricted_and_valid():
    pod = pod_spec(with_adapters())
    for container in [*pod["initContainers"], *pod["containers"]]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["runAsNonRoot"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert not any("hostPath" in v for v in pod["volumes"])
    isvc = with_adapters().build()
    for obj in build_children(isvc, plan(isvc)):
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_with_lora_the_network_policy_admits_the_operator_to_read_the_adapters():
    isvc = with_adapters().build()
    policy = next(o for o in build_children(isvc, plan(isvc)) if o["kind"] == "NetworkPolicy")
    *_, from_operator = policy["spec"]["ingress"]
    assert from_operator["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert from_operator["ports"] == [{"port": "http", "protocol": "TCP"}]
    plain = Spec().build()
    policy = next(o for o in build_children(plain, plan(plain)) if o["kind"] == "NetworkPolicy")
    assert len(policy["spec"]["ingress"]) == 3  # router, monitoring, ranks


def router_args(spec: Spec) -> list[str]:
    isvc = spec.build()
    deploy = next(o for o in build_children(isvc, plan(isvc)) if o["kind"] == "Deployment")
    return deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def test_with_runtime_loading_the_router_loads_and_knows_where_the_spec_adapters_are():
    args = router_args(with_adapters(lora={"allowRuntimeLoading": True}))
    assert "--lora-runtime-loading" in args
    assert args[args.index("--adapters") + 1] == ",".join(
        f"{a['name']}={path}" for a, path in zip(ADAPTERS, PATHS, strict=True))


def test_without_runtime_loading_the_router_gets_no_lora_flags():
    assert not any("lora" in a or a == "--adapters" for a in router_args(with_adapters()))
    assert not any("lora" in a for a in router_args(Spec()))
