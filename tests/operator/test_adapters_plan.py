"""LoRA in the plan and the pods: slots in the memory budget, the runtimes' flags, and each
adapter delivered into the pod as the model is."""

from __future__ import annotations

import kubernetes_validate
import pytest

from frota.api.memory import lora_slot_bytes
from frota.operator.builders import build_children
from frota.plan.describe import describe
from frota.plan.model_shapes import SMOLLM2_135M, locate_adapter
from frota.plan.planner import plan
from frota.plan.validation import SpecError
from tests.operator.isvc_fixtures import Spec
from tests.operator.test_runtime_vllm import flag

ADAPTERS = [
    {"name": "sql", "uri": "pvc://loras/sql/v1"},
    {"name": "chat", "uri": "hf://org/chat-lora"},
    {"name": "tone", "uri": "https://example.com/tone"},
    {"name": "baked", "uri": "file:///opt/adapters/baked"},
]
PATHS = ["/adapters/pvc/loras/sql/v1", "/adapters/cache/chat", "/adapters/cache/tone",
         "/opt/adapters/baked"]


def with_adapters(spec: Spec | None = None, lora: dict | None = None) -> Spec:
    spec = (spec or Spec()).set("spec.adapters", ADAPTERS)
    return spec.set("spec.engine.lora", lora) if lora is not None else spec


def pod_spec(spec: Spec) -> dict:
    isvc = spec.build()
    sts = [o for o in build_children(isvc, plan(isvc)) if o["kind"] == "StatefulSet"]
    return sts[0]["spec"]["template"]["spec"]


def test_each_uri_scheme_maps_to_a_local_path():
    found = [locate_adapter(a["name"], a["uri"]) for a in ADAPTERS]
    assert [a.path for a in found] == PATHS
    assert [a.delivery for a in found] == ["pvc", "download", "download", "local"]
    assert found[0].pvc_claim == "loras"


def test_the_plan_reserves_max_adapters_slots_before_the_kv_cache():
    without = plan(Spec().build()).serving_budget
    with_lora = plan(with_adapters(lora={"maxAdapters": 3, "maxRank": 32}).build()).serving_budget
    slot = lora_slot_bytes(SMOLLM2_135M, 32, "float32")  # CPU plans float32
    assert with_lora.adapter_bytes_per_rank == 3 * slot
    assert without.adapter_bytes_per_rank == 0
    assert without.kv_cache_bytes_per_rank - with_lora.kv_cache_bytes_per_rank == 3 * slot
    assert with_lora.kv_cache_tokens_per_replica < without.kv_cache_tokens_per_replica


def test_tensor_parallel_reserves_each_ranks_share():
    budget = plan(with_adapters(Spec().tensor(3)).build()).serving_budget
    assert budget.adapter_bytes_per_rank == 4 * lora_slot_bytes(SMOLLM2_135M, 16, "float32", 3)


def test_frota_plan_prints_the_adapter_slots_only_with_lora():
    isvc = with_adapters().build()
    text = describe(isvc, plan(isvc))
    assert "    adapter slots per rank: 4 x rank 16 = " in text
    assert "  adapters: sql from pvc://loras/sql/v1 (/adapters/pvc/loras/sql/v1, delivered by pvc)" in text
    plain = Spec().build()
    assert "adapter" not in describe(plain, plan(plain))


def test_slots_that_leave_no_room_for_one_sequence_name_the_memory_and_the_slots():
    spec = with_adapters(Spec().set("spec.resources.memory", "1300Mi"), {"maxAdapters": 256, "maxRank": 256})
    with pytest.raises(SpecError) as info:
        plan(spec.build())
    assert info.value.errors[0].field == "spec.resources.memory"
    assert "of adapter slots (spec.engine.lora)" in info.value.errors[0].message


def test_frota_workers_get_vllms_lora_flags():
    args = list(plan(with_adapters(lora={"maxAdapters": 2, "maxRank": 64}).build()).groups[0].leader.args)
    assert "--enable-lora" in args
    assert (flag(args, "--max-loras"), flag(args, "--max-lora-rank")) == ("2", "64")
    start = args.index("--lora-modules") + 1
    assert args[start:start + 4] == [f"{a['name']}={p}" for a, p in zip(ADAPTERS, PATHS, strict=True)]
    assert "--allow-runtime-lora" not in args


def test_runtime_loading_adds_its_flag_and_a_lora_block_alone_enables_lora():
    args = plan(Spec().set("spec.engine.lora", {"allowRuntimeLoading": True}).build()).groups[0].leader.args
    assert "--enable-lora" in args and "--allow-runtime-lora" in args
    assert "--lora-modules" not in args


def test_no_lora_no_flags_and_the_same_revision():
    topo = plan(Spec().build())
    assert not any("lora" in a for a in topo.groups[0].leader.args)
    assert plan(with_adapters().build()).groups[0].revision != topo.groups[0].revision


def test_vllm_workers_get_the_same_flags_and_the_runtime_loading_env():
    spec = (with_adapters(lora={"maxAdapters": 2, "allowRuntimeLoading": True})
            .set("spec.runtime", {"engine": "vllm"}).set("spec.engine.kvCache", {"blockSize": 32})
            .set("spec.resources.memory", "6Gi"))
    group = plan(spec.build()).groups[0]
    args = list(group.pod.args)
    assert (flag(args, "--max-loras"), flag(args, "--max-lora-rank")) == ("2", "16")
    assert "--enable-lora" in args and "--allow-runtime-lora" not in args
    assert flag(args, "--lora-modules") == f"sql={PATHS[0]}"
    assert group.leader.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert group.pod.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


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
