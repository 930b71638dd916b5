"""The vllm runtime's builder: one case per mapped spec field (`frota.plan.runtimes.vllm`)."""

from __future__ import annotations

import pytest

from frota.api import InferenceServiceSpec
from frota.plan.runtimes import vllm

MODEL = {"name": "smollm2", "uri": "alias:smollm2"}


def spec(**fields) -> InferenceServiceSpec:
    fields.setdefault("engine", {}).setdefault("kvCache", {}).setdefault("blockSize", 32)  # vLLM on CPU
    return InferenceServiceSpec.model_validate({"model": MODEL, "runtime": {"engine": "vllm"}, **fields})


def rank0(s: InferenceServiceSpec, rank: int | None = 0, kv: int | None = 3 * vllm.GIB):
    return vllm.launch(s, s.parallelism, s.resources, model_path="/models/hf", port=8000,
                       master_addr="g-0.g", master_port=29500, rank=rank, kv_cache_bytes=kv)


def flag(args, name: str) -> str | None:
    """The value after `name`, or None when absent."""
    args = list(args)
    return args[args.index(name) + 1] if name in args else None


GPU = {"accelerator": {"count": 1}}


def test_model_path_and_served_name():
    launch = rank0(spec())
    assert launch.args[0] == "/models/hf"
    assert flag(launch.args, "--served-model-name") == "smollm2"
    assert (flag(launch.args, "--host"), flag(launch.args, "--port")) == ("0.0.0.0", "8000")
    assert launch.command == vllm.SERVER


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, "float32"),                                   # auto on CPU, as Frota resolves it
    ({"resources": GPU}, "bfloat16"),                  # auto on an accelerator
    ({"engine": {"dtype": "float16"}}, "float16"),
])
def test_dtype(fields, expected):
    assert flag(rank0(spec(**fields)).args, "--dtype") == expected


def test_max_model_len_only_when_set():
    assert flag(rank0(spec()).args, "--max-model-len") is None
    assert flag(rank0(spec(engine={"maxModelLen": 1024})).args, "--max-model-len") == "1024"


def test_scheduler_limits():
    args = rank0(spec(engine={"scheduler": {"maxNumSeqs": 12, "maxNumBatchedTokens": 512}})).args
    assert (flag(args, "--max-num-seqs"), flag(args, "--max-num-batched-tokens")) == ("12", "512")


def test_block_size_and_prefix_caching():
    on = rank0(spec(resources=GPU, engine={"kvCache": {"blockSize": 8}})).args
    assert flag(on, "--block-size") == "8" and "--enable-prefix-caching" in on
    off = rank0(spec(engine={"kvCache": {"prefixCaching": False}})).args
    assert "--no-enable-prefix-caching" in off and "--enable-prefix-caching" not in off


def test_parallel_sizes_and_expert_parallel():
    args = rank0(spec(parallelism={"tensor": 2, "pipeline": 3})).args
    assert (flag(args, "--tensor-parallel-size"), flag(args, "--pipeline-parallel-size")) == ("2", "3")
    assert "--enable-expert-parallel" not in args
    assert "--enable-expert-parallel" in rank0(spec(parallelism={"tensor": 2, "expert": 2})).args


def test_fp8_weights_and_kv_cache():
    plain = rank0(spec(resources=GPU)).args
    assert flag(plain, "--quantization") is None and flag(plain, "--kv-cache-dtype") is None
    fp8 = rank0(spec(resources=GPU, engine={"quantization": {"weights": "fp8", "kvCache": "fp8"}})).args
    assert (flag(fp8, "--quantization"), flag(fp8, "--kv-cache-dtype")) == ("fp8", "fp8")


def test_memory_fraction_on_gpu_kv_space_on_cpu():
    gpu = rank0(spec(resources=GPU, engine={"kvCache": {"memoryFraction": 0.8}}))
    assert flag(gpu.args, "--gpu-memory-utilization") == "0.8"
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu.env
    cpu = rank0(spec(), kv=int(2.7 * vllm.GIB))
    assert flag(cpu.args, "--gpu-memory-utilization") is None
    assert cpu.env["VLLM_CPU_KVCACHE_SPACE"] == "2"   # whole GiB, rounded down: never over budget
    assert cpu.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert rank0(spec(), kv=100 * 2**20).env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in rank0(spec(), kv=None).env


def test_runtime_args_come_last():
    args = rank0(spec(runtime={"engine": "vllm", "args": ["--enforce-eager", "--max-num-seqs=4"]})).args
    assert args[-2:] == ("--enforce-eager", "--max-num-seqs=4")


def test_single_rank_groups_need_no_multi_node_flags():
    launch = rank0(spec(), rank=None)
    assert "--nnodes" not in launch.args and launch.command == vllm.SERVER


def test_multi_node_group_local_processes():
    s = spec(parallelism={"tensor": 2})
    leader, follower = rank0(s, rank=0), rank0(s, rank=1)
    for launch, rank in ((leader, "0"), (follower, "1")):
        assert flag(launch.args, "--nnodes") == "2" and flag(launch.args, "--node-rank") == rank
        assert (flag(launch.args, "--master-addr"), flag(launch.args, "--master-port")) == ("g-0.g", "29500")
    assert "--headless" not in leader.args and "--headless" in follower.args


def test_multi_node_group_pod_template():
    launch = rank0(spec(parallelism={"tensor": 2}), rank=None)
    assert flag(launch.args, "--node-rank") == "$(FROTA_RANK)"   # the kubelet expands it per pod
    assert launch.command[:3] == ("/bin/sh", "-c", vllm.HEADLESS_UNLESS_RANK_0)
    assert launch.command[3:] == vllm.SERVER and "--headless" not in launch.args


def test_on_one_machine_a_group_is_one_server_listening_where_frota_up_says():
    from frota.plan.addressing import LocalAddressing

    s = spec(parallelism={"tensor": 2}, runtime={"engine": "vllm", "args": ["--port", "1", "-O0"]})
    for rank in (0, None):
        launch = vllm.launch(s, s.parallelism, s.resources, model_path="/models/hf", port=9000,
                             master_addr="127.0.0.1", master_port=29500, rank=rank, kv_cache_bytes=None,
                             addressing=LocalAddressing(host="0.0.0.0"))
        assert launch.command == vllm.SERVER and flag(launch.args, "--nnodes") is None
        assert launch.args[-7:] == ("--distributed-executor-backend", "mp", "-O0",
                                    "--host", "0.0.0.0", "--port", "9000")


def test_probes_use_vllms_health():
    launch = rank0(spec())
    assert (launch.live_path, launch.ready_path) == ("/health", "/health")


@pytest.mark.parametrize(("rank", "tail"), [("0", "serve /m"), ("1", "serve /m --headless")])
def test_headless_wrapper_in_a_real_shell(rank, tail):
    import subprocess

    out = subprocess.run(["/bin/sh", "-c", vllm.HEADLESS_UNLESS_RANK_0, "echo", "serve", "/m"],
                         env={"FROTA_RANK": rank}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == tail


def _worker_pod(path: str):
    from frota.operator.render import render
    from frota.plan.validation import load
    from tests.api.test_crd import _sample

    _, children = render(load(_sample(path)))
    sts = next(c for c in children if c["kind"] == "StatefulSet")
    return sts["spec"]["template"]["spec"]


def test_vllm_pod_runs_vllm_on_a_converted_model():
    pod = _worker_pod("vllm-cpu-smollm2.yaml")
    worker = pod["containers"][0]
    assert worker["image"] == "frota-vllm-cpu:dev"
    assert worker["command"] == list(vllm.SERVER)
    assert worker["args"][0] == "/models/converted/smollm2"
    assert worker["args"][-2:] == ["--optimization-level", "0"]      # runtime.args last
    assert {worker[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")} == {"/health"}
    (convert,) = pod["initContainers"]
    assert convert["command"] == ["frota"] and convert["args"] == ["convert", "smollm2", "/models/converted/smollm2"]
    assert convert["image"] != worker["image"]                      # Frota's image holds the GGUF
    mounts = {m["mountPath"]: m for m in worker["volumeMounts"]}
    assert mounts["/models/converted"]["readOnly"] is True and "/dev/shm" in mounts
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HOME"] == "/tmp"


def test_frota_pod_is_unchanged_by_the_runtime_field():
    pod = _worker_pod("cpu-tiny-smollm2.yaml")
    worker = pod["containers"][0]
    assert worker["command"] == ["frota"] and worker["args"][0] == "worker"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "initContainers" not in pod and all(v["name"] != "dshm" for v in pod["volumes"])


def test_runtime_changes_roll_the_groups_but_frota_revisions_hold():
    from frota.plan.planner import revision

    frota = InferenceServiceSpec.model_validate({"model": MODEL})
    explicit = InferenceServiceSpec.model_validate({"model": MODEL, "runtime": {"engine": "frota"}})
    assert revision(frota, "worker", frota.parallelism, frota.resources) == revision(
        explicit, "worker", explicit.parallelism, explicit.resources)
    s = spec()
    assert revision(s, "worker", s.parallelism, s.resources) != revision(
        frota, "worker", frota.parallelism, frota.resources)


def test_vllm_plan_reserves_vllms_own_overhead_on_cpu():
    from frota.plan.planner import plan
    from frota.plan.validation import SpecError, load

    def manifest(memory: str):
        return load({"apiVersion": "frota.dev/v1alpha1", "kind": "InferenceService",
                     "metadata": {"name": "v"},
                     "spec": {**spec(resources={"memory": memory}, engine={"maxModelLen": 2048}).to_wire()}})

    with pytest.raises(SpecError, match="of runtime"):
        plan(manifest("3Gi"))                                    # Frota's engine would fit here
    budget = plan(manifest("5Gi")).groups[0].budget
    assert budget.runtime_overhead_bytes == vllm.CPU_RUNTIME_OVERHEAD_BYTES


def test_tool_calls_are_parsed_hermes_style_unless_runtime_args_name_another_parser():
    args = rank0(spec()).args
    assert "--enable-auto-tool-choice" in args and flag(args, "--tool-call-parser") == "hermes"
    custom = rank0(spec(runtime={"engine": "vllm", "args": ["--tool-call-parser", "llama3_json"]})).args
    # argparse keeps the last value: runtime.args come after the default.
    assert [a for i, a in enumerate(custom) if custom[i - 1] == "--tool-call-parser"][-1] == "llama3_json"


def test_in_front_of_vllm_the_router_validates_requests_as_frotas_workers_do():
    from frota.plan.planner import router_args

    assert "--validate-requests" in router_args(spec(), ())
    frota = InferenceServiceSpec.model_validate({"model": MODEL})
    assert "--validate-requests" not in router_args(frota, ())  # the workers validate
    # Beside the LoRA flags, which are independent of it.
    lora = spec(engine={"lora": {"allowRuntimeLoading": True}})
    assert {"--validate-requests", "--lora-runtime-loading"} <= set(router_args(lora, ()))
