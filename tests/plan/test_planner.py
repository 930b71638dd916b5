"""The planner: groups, ranks, worker args/env, and semantic errors that name the field."""

from __future__ import annotations

import pytest

from frota.api.contract import FleetKey, Role
from frota.plan import planner
from frota.plan.addressing import LISTEN_FLAGS, LocalAddressing, without_flags
from frota.plan.memory import role_budget
from frota.plan.model_shapes import SMOLLM2_135M, locate
from frota.plan.planner import plan
from frota.plan.topology import Topology
from frota.plan.validation import SpecError
from tests.isvc_fixtures import Spec


def _errors(spec: Spec) -> list[str]:
    with pytest.raises(SpecError) as err:
        plan(spec.build())
    return [str(e) for e in err.value.errors]


def test_colocated_plan_has_one_group_per_replica_and_one_rank_per_shard():
    topo = plan(Spec().replicas(2).tensor(3).build())
    assert topo.mode == "Colocated"
    assert [g.name for g in topo.groups] == ["tiny-worker-0", "tiny-worker-1"]
    assert [g.world_size for g in topo.groups] == [3, 3]
    assert [r.env["FROTA_RANK"] for r in topo.groups[1].ranks] == ["0", "1", "2"]
    assert {r.env["FROTA_WORLD_SIZE"] for r in topo.groups[1].ranks} == {"3"}


def test_ranks_find_their_leader_by_stable_dns_name():
    group = plan(Spec().tensor(3).build()).groups[0]
    assert {r.env["FROTA_MASTER_ADDR"] for r in group.ranks} == {"tiny-worker-0-0.tiny-worker-0"}
    assert {r.env["FROTA_MASTER_PORT"] for r in group.ranks} == {"29500"}


def test_worker_args_follow_the_model_uri_mapping():
    rank = plan(Spec().build()).groups[0].leader
    assert rank.args == ("worker", "--model", "smollm2", "--port", "8000", "--role", "both")
    assert locate("pvc://models/llama/8b").model_arg == "/models/llama/8b"
    assert locate("hf://org/repo").model_arg == "/models/cache/org/repo"
    assert locate("synthetic:dense-tiny").model_arg == "synthetic:dense-tiny"


def on_this_machine(spec: Spec, **settings) -> Topology:
    """The plan of `spec` on one machine, at ports taken from 9000 (rendezvous from 29600)."""
    isvc = spec.build()
    shapes = planner.role_shapes(isvc.spec)
    world = 1 if isvc.spec.runtime.engine == "vllm" else shapes[0].parallelism.world_size
    groups = sum(s.groups for s in shapes)
    ports = tuple(tuple(9000 + g * world + r for r in range(world)) for g in range(groups))
    return plan(isvc, LocalAddressing(http_ports=ports, master_ports=tuple(range(29600, 29600 + groups)),
                                      **settings))


def test_local_addressing_gives_every_rank_its_taken_port_and_a_loopback_master():
    topo = on_this_machine(Spec().replicas(2).tensor(3), host="0.0.0.0")
    assert [r.http_port for g in topo.groups for r in g.ranks] == list(range(9000, 9006))
    leader = topo.groups[1].leader
    assert leader.args == ("worker", "--model", "smollm2", "--role", "both",
                           "--host", "0.0.0.0", "--port", "9003")
    env = topo.rank_env(topo.groups[1], topo.groups[1].ranks[2])
    assert {k: env[k] for k in ("FROTA_RANK", "FROTA_WORLD_SIZE", "FROTA_MASTER_ADDR", "FROTA_MASTER_PORT",
                                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "FROTA_RANK": "2", "FROTA_WORLD_SIZE": "3", "FROTA_MASTER_ADDR": "127.0.0.1",
        "FROTA_MASTER_PORT": "29601", "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29601"}


def test_on_one_machine_where_a_process_runs_goes_over_the_spec_and_its_flags_are_dropped():
    spec = Spec().set("spec.engine.extraArgs", ["--port", "1", "--host=h", "--trace"])
    topo = on_this_machine(spec, threads=3, devices=(("4,5",),), log_level="debug",
                           fleet_key_file="/run/key")
    group = topo.groups[0]
    assert group.leader.args[-5:] == ("--trace", "--host", "127.0.0.1", "--port", "9000")
    env = topo.rank_env(group, group.leader, {"OMP_NUM_THREADS": "8", "FROTA_MAX_NUM_SEQS": "3"})
    assert (env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"], env["FROTA_LOG_LEVEL"]) == ("3", "4,5", "debug")
    assert env["FROTA_MAX_NUM_SEQS"] == "3"  # the spec's env still goes over the engine's
    assert env[FleetKey.FILE_ENV] == "/run/key"
    assert topo.router.env[FleetKey.FILE_ENV] == "/run/key"
    assert topo.router.env["FROTA_LOG_LEVEL"] == "debug"


def test_a_vllm_group_on_one_machine_is_one_server_that_runs_its_workers():
    spec = (Spec().tensor(3).set("spec.runtime.engine", "vllm").set("spec.engine.kvCache.blockSize", 32)
            .set("spec.engine.maxModelLen", 2048).set("spec.resources.memory", "16Gi")
            .set("spec.runtime.args", ["--port", "1", "-O0"]))
    group = on_this_machine(spec).groups[0]
    [server] = group.ranks
    assert server.command == ("vllm", "serve") and group.pod.argv == (*server.command, *server.args)
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(server.args)
    assert server.args[-7:] == ("--distributed-executor-backend", "mp", "-O0",
                                "--host", "127.0.0.1", "--port", "9000")
    assert server.process_env["FROTA_WORLD_SIZE"] == "1"
    assert "--tensor-parallel-size 3" in " ".join(server.args)


def test_a_specs_listen_flags_are_dropped_in_both_spellings():
    assert without_flags(("a", "--port", "1", "--port=2", "--host", "h", "b"), LISTEN_FLAGS) == ("a", "b")


def test_in_a_cluster_the_addressing_adds_nothing_to_a_process():
    topo = plan(Spec().tensor(3).build())
    assert all(not r.process_env for g in topo.groups for r in g.ranks)
    assert set(topo.router.env) == {"FROTA_MAX_INFLIGHT", "FROTA_MAX_QUEUE"}


def test_without_ports_taken_a_plan_on_one_machine_says_which_processes_run():
    topo = plan(Spec().replicas(2).tensor(3).build(), LocalAddressing())
    assert [len(g.ranks) for g in topo.groups] == [3, 3]
    assert {r.http_port for g in topo.groups for r in g.ranks} == {0}


def test_disaggregated_units_multiply_role_replicas():
    topo = plan(Spec().replicas(2).disaggregated(prefill=1, decode=3).build())
    assert topo.mode == "Disaggregated"
    assert len(topo.groups_of("prefill")) == 2
    assert len(topo.groups_of("decode")) == 6
    assert topo.groups_of("prefill")[0].leader.args[-1] == "prefill"
    assert topo.engine_env["FROTA_MIN_PREFILL_TOKENS"] == "256"


def test_each_role_knows_its_groups_per_unit_and_keeps_them_when_scaled_to_zero():
    topo = plan(Spec().replicas(0).disaggregated(prefill=1, decode=3).build())
    assert [(s.role, s.units, s.groups_per_unit, s.groups) for s in topo.role_shapes] == [
        ("prefill", 0, 1, 0), ("decode", 0, 3, 0)]
    assert topo.groups == ()


def test_the_roles_are_the_contracts_and_the_serving_role_is_decided_by_the_topology():
    colocated = plan(Spec().build())
    disaggregated = plan(Spec().disaggregated().build())
    assert colocated.roles == (Role.WORKER,) and colocated.serving_role is Role.WORKER
    assert disaggregated.roles == (Role.PREFILL, Role.DECODE)
    assert disaggregated.serving_role is Role.DECODE
    assert all(type(g.role) is Role for g in disaggregated.groups)
    assert disaggregated.serving_budget is disaggregated.groups_of(Role.DECODE)[0].budget


def test_each_roles_memory_is_budgeted_once_per_plan(monkeypatch: pytest.MonkeyPatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[2])  # the role's parallelism
        return role_budget(*args, **kwargs)

    monkeypatch.setattr(planner, "role_budget", counted)
    topo = plan(Spec().replicas(3).disaggregated(prefill=1, decode=2).build())
    assert len(topo.groups) == 9
    assert len(calls) == 2  # prefill and decode, not once per group nor per check


def test_the_topology_carries_each_roles_shape_and_revision_even_at_zero_groups():
    spec = Spec().replicas(0).disaggregated().set(
        "spec.disaggregation.decode.resources", {"cpu": "3", "memory": "3Gi"})
    topo = plan(spec.build())
    assert topo.groups == ()
    prefill, decode = topo.shape_of("prefill"), topo.shape_of("decode")
    assert (prefill.resources_field, decode.resources_field) == (
        "spec.resources", "spec.disaggregation.decode.resources")
    assert decode.resources.cpu == "3"
    assert set(topo.revisions) == {"prefill", "decode"}
    assert topo.revisions["prefill"] != topo.revisions["decode"]
    scaled = plan(spec.replicas(1).build())
    assert [g.revision for g in scaled.groups_of("decode")] == [topo.revisions["decode"]]


def test_scaled_to_zero_has_no_groups_but_a_router():
    topo = plan(Spec().replicas(0).build())
    assert topo.groups == ()
    assert topo.router.replicas == 1


def test_tensor_must_divide_attention_heads():
    assert _errors(Spec().tensor(2)) == [
        "spec.parallelism.tensor: 2 does not divide the 9 attention heads of smollm2"
    ]


def test_pipeline_must_divide_layers():
    assert _errors(Spec().pipeline(4)) == [
        "spec.parallelism.pipeline: 4 does not divide the 30 layers of smollm2"
    ]


def test_expert_parallel_needs_a_moe_model_and_must_divide_experts():
    assert _errors(Spec().tensor(3).set("spec.parallelism.expert", 3)) == [
        "spec.parallelism.expert: 3 needs a mixture-of-experts model; smollm2 is dense"
    ]
    moe = Spec(uri="synthetic:moe-small").set("spec.parallelism", {"tensor": 4, "expert": 4})
    assert plan(moe.build()).groups[0].sharding.expert == 4
    bad = Spec(uri="synthetic:moe-small,experts=6").set("spec.parallelism", {"tensor": 4, "expert": 4})
    assert _errors(bad) == ["spec.parallelism.expert: 4 does not divide the 6 experts of moe-small,experts=6"]


def test_synthetic_specs_parse_like_the_engine():
    from frota.plan.model_shapes import synthetic_shape

    shape = synthetic_shape("moe-small,layers=6,max_len=4096")
    assert (shape.num_layers, shape.num_experts, shape.max_position) == (6, 8, 4096)
    assert synthetic_shape("hidden=128,heads=4").head_dim == 32
    assert _errors(Spec(uri="synthetic:huge")) == [
        "spec.model.uri: unknown synthetic preset 'huge'; presets: dense-tiny, moe-tiny, dense-small, moe-small"
    ]


def test_role_overrides_are_named_by_their_own_field():
    spec = Spec().disaggregated().set(
        "spec.disaggregation.prefill.parallelism", {"tensor": 2}).set(
        "spec.disaggregation.decode.parallelism", {"tensor": 2})
    errors = _errors(spec)
    assert "spec.disaggregation.prefill.parallelism.tensor: 2 does not divide the 9 attention heads of smollm2" in errors


def test_unknown_alias_is_an_error_on_the_uri():
    errors = _errors(Spec(uri="alias:gpt5"))
    assert errors == ["spec.model.uri: unknown alias 'gpt5'; the worker image bakes in: smollm2"]


def test_max_model_len_beyond_the_context_is_an_error():
    assert _errors(Spec().set("spec.engine.maxModelLen", 16384)) == [
        "spec.engine.maxModelLen: 16384 exceeds the 8192-token context of smollm2"
    ]


def test_memory_too_small_for_one_sequence_names_the_memory_field():
    (error,) = _errors(Spec().set("spec.resources.memory", "1Gi"))
    assert error.startswith("spec.resources.memory: 1.00 GiB per rank")
    assert "not one sequence of 8192 tokens fits" in error


def test_memory_budget_of_smollm2_on_cpu():
    budget = plan(Spec().build()).groups[0].budget
    # 134.5M parameters in float32, tied embeddings.
    assert 530e6 < budget.weight_bytes_per_rank < 545e6
    # K and V, 30 layers, 3 KV heads of 64, 4 bytes.
    assert budget.kv_bytes_per_token_per_rank == 2 * 30 * 3 * 64 * 4
    assert budget.kv_cache_tokens_per_replica % 16 == 0
    assert budget.sequences_at_max_model_len == budget.kv_cache_tokens_per_replica // 8192


def test_tensor_parallel_and_quantization_shrink_per_rank_memory():
    base = plan(Spec().gpu().build()).groups[0].budget
    tp3 = plan(Spec().gpu().tensor(3).build()).groups[0].budget
    int4 = plan(Spec().gpu().set("spec.engine.quantization", {"weights": "int4", "kvCache": "fp8"}).build())
    assert tp3.weight_bytes_per_rank < base.weight_bytes_per_rank / 2
    assert tp3.kv_bytes_per_token_per_rank == base.kv_bytes_per_token_per_rank / 3
    # int4 weights carry float32 scales and zeros per group of 32, and a tied embedding keeps
    # its floats beside an int4 LM head (the engine's own accounting, frota.api.memory).
    assert int4.groups[0].budget.weight_bytes_per_rank < 0.6 * base.weight_bytes_per_rank
    # fp8 KV: a byte per element plus a float16 scale per (token, head)
    assert int4.groups[0].budget.kv_bytes_per_token_per_rank == 2 * 30 * 3 * (64 + 2)


def test_gpu_without_declared_memory_plans_weights_only():
    group = plan(Spec().gpu(memory=None).build()).groups[0]
    assert group.budget.kv_cache_tokens_per_replica is None
    assert "FROTA_KV_CACHE_MEMORY" not in group.leader.env
    assert group.leader.env["FROTA_DTYPE"] == "bfloat16"
    assert group.leader.env["FROTA_DEVICE"] == "cuda"


def test_unknown_shape_warns_and_skips_shape_checks():
    topo = plan(Spec(uri="hf://org/big").tensor(8).build())
    assert topo.groups[0].budget is None
    assert topo.warnings and "hf://org/big" in topo.warnings[0]


def test_revision_changes_with_pod_affecting_fields_only():
    rev = plan(Spec().build()).groups[0].revision
    assert plan(Spec().replicas(3).build()).groups[0].revision == rev
    assert plan(Spec().set("spec.router.replicas", 3).build()).groups[0].revision == rev
    assert plan(Spec().set("spec.engine.dtype", "bfloat16").build()).groups[0].revision != rev
    assert plan(Spec().set("spec.resources.memory", "4Gi").build()).groups[0].revision != rev


def test_smollm2_shape_matches_the_published_config():
    s = SMOLLM2_135M
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim) == (30, 576, 9, 3, 64)
    assert (s.intermediate_size, s.vocab_size, s.max_position) == (1536, 49152, 8192)


def test_a_cpu_worker_decides_dtype_auto_on_its_node_and_is_planned_at_float32():
    auto = plan(Spec().build()).groups[0]
    pinned = plan(Spec().set("spec.engine.dtype", "float32").build()).groups[0]
    assert auto.leader.env["FROTA_DTYPE"] == "auto"
    assert pinned.leader.env["FROTA_DTYPE"] == "float32"
    # Budgeted as float32, so a worker that picks bfloat16 has room to spare, never too little.
    assert auto.budget.weight_bytes_per_rank == pinned.budget.weight_bytes_per_rank


def test_the_topology_says_whether_the_model_cache_job_converts_the_model():
    vllm = (Spec().set("spec.runtime.engine", "vllm").set("spec.engine.kvCache.blockSize", 32)
            .set("spec.engine.maxModelLen", 2048).set("spec.resources.memory", "5Gi"))
    assert plan(vllm.set("spec.model.cache", {"enabled": True}).build()).converts_into_cache
    assert not plan(vllm.set("spec.model.cache", {"enabled": False}).build()).converts_into_cache
    assert not plan(Spec().set("spec.model.cache", {"enabled": True}).build()).converts_into_cache
