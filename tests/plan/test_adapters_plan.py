"""LoRA in the plan: slots in the memory budget and the runtimes' flags (the pods that
deliver the adapters: tests/operator/builders/test_adapter_pods.py)."""

from __future__ import annotations

import pytest

from frota.api.memory import lora_slot_bytes
from frota.plan.describe import describe
from frota.plan.model_shapes import SMOLLM2_135M, locate_adapter
from frota.plan.planner import plan
from frota.plan.validation import SpecError
from tests.isvc_fixtures import Spec
from tests.plan.test_runtime_vllm import flag

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
