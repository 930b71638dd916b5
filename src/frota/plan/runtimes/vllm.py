"""The vllm runtime: the same spec fields as vLLM's `serve` flags and environment.

Mapped (each a unit test in tests/plan/test_runtime_vllm.py):

| spec field                                   | vLLM                                                |
|----------------------------------------------|-----------------------------------------------------|
| model (the local path), model.name           | the model argument, `--served-model-name`           |
| engine.dtype (auto as Frota resolves it)     | `--dtype`                                           |
| engine.maxModelLen                           | `--max-model-len`                                   |
| engine.scheduler.maxNumSeqs / BatchedTokens  | `--max-num-seqs`, `--max-num-batched-tokens`        |
| engine.kvCache.blockSize / prefixCaching     | `--block-size`, `--[no-]enable-prefix-caching`      |
| engine.kvCache.memoryFraction                | `--gpu-memory-utilization` (GPU)                    |
| the planner's KV budget (CPU)                | `VLLM_CPU_KVCACHE_SPACE` (GiB)                      |
| parallelism.tensor / pipeline                | `--tensor-parallel-size`, `--pipeline-parallel-size`|
| parallelism.expert == tensor                 | `--enable-expert-parallel`                          |
| engine.quantization.weights fp8              | `--quantization fp8`                                |
| engine.quantization.kvCache fp8              | `--kv-cache-dtype fp8`                              |
| ranks over several pods                      | `--nnodes`, `--node-rank`, `--master-addr/-port`, `--headless` off rank 0 |
| ranks on one machine (`frota up`)            | one server: `--distributed-executor-backend mp`     |
| (where it listens: the addressing's)         | `--host 0.0.0.0 --port` (in a pod); last on one machine |
| (tools)                                      | `--enable-auto-tool-choice --tool-call-parser hermes` |
| engine.lora (or spec.adapters' defaults)     | `--enable-lora`, `--max-loras`, `--max-lora-rank`   |
| spec.adapters (each name, its local path)    | `--lora-modules name=path ...`                      |
| engine.lora.allowRuntimeLoading              | `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`             |
| runtime.args                                 | appended last                                       |

`engine.scheduler.maxQueue` has no vLLM flag: the router's admission answers 429 in
front of vLLM workers. What vLLM cannot serve at all is refused by the API
(`frota.api.runtime.VLLM_RULES`) before it gets here.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence

from frota.api import InferenceServiceSpec, Parallelism, Resources
from frota.api.contract import Env, ServingPath
from frota.plan.addressing import Addressing, KubernetesAddressing
from frota.plan.memory import MemoryBudget
from frota.plan.model_shapes import AdapterLocation
from frota.plan.runtimes import Launch, lora_args, resolve_dtype
from frota.plan.topology import Rank, ReplicaGroup, RoleShape

#: vLLM's OpenAI server, as its images name it.
SERVER = ("vllm", "serve")
#: Frota's tool-call format is Hermes-style (`<tool_call>{json}</tool_call>`, see
#: docs/structured-outputs.md); vLLM parses the same with its `hermes` parser. A model
#: with its own format names another parser in runtime.args, which come last and win.
TOOL_CALL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
#: In a pod template every rank shares one command; ranks after 0 run headless (no API server).
HEADLESS_UNLESS_RANK_0 = f'if [ "${Env.RANK}" != 0 ]; then set -- "$@" --headless; fi; exec "$0" "$@"'
RANK_FROM_ENV = f"$({Env.RANK})"  # expanded by the kubelet from the container's env
IN_PODS = KubernetesAddressing()

GIB = 2**30
#: What vLLM's CPU server holds besides weights and KV cache: its API server, engine core
#: and worker processes (measured: 4.0 GB PSS serving SmolLM2 in float32, 0.5 GB of
#: weights, a 1 GiB KV cache; vllm-cpu 0.32.0).
CPU_RUNTIME_OVERHEAD_BYTES = 5 * GIB // 2


def serve_args(spec: InferenceServiceSpec, parallelism: Parallelism, resources: Resources,
               adapters: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The flags every rank of a group shares, from the spec, after the model and where it
    listens (runtime.args not yet appended)."""
    engine = spec.engine
    args = [
        "--dtype", resolve_dtype(spec, resources),  # Frota's `auto`, made explicit
        "--max-num-seqs", str(engine.scheduler.maxNumSeqs),
        "--max-num-batched-tokens", str(engine.scheduler.maxNumBatchedTokens),
        "--block-size", str(engine.kvCache.blockSize),
        "--enable-prefix-caching" if engine.kvCache.prefixCaching else "--no-enable-prefix-caching",
        "--tensor-parallel-size", str(parallelism.tensor),
        "--pipeline-parallel-size", str(parallelism.pipeline),
        *TOOL_CALL_ARGS,
    ]
    if engine.maxModelLen is not None:
        args += ["--max-model-len", str(engine.maxModelLen)]
    if parallelism.expert > 1:
        args.append("--enable-expert-parallel")
    if engine.quantization.weights == "fp8":
        args += ["--quantization", "fp8"]
    if engine.quantization.kvCache == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if resources.accelerator is not None:
        args += ["--gpu-memory-utilization", str(engine.kvCache.memoryFraction)]
    return args + lora_args(spec.lora, adapters)


def lora_env(spec: InferenceServiceSpec) -> dict[str, str]:
    """vLLM reads runtime loading (/v1/load_lora_adapter) from its environment, not a flag."""
    if spec.lora is not None and spec.lora.allowRuntimeLoading:
        return {Env.RUNTIME_LORA: "True"}
    return {}


#: vLLM's multiprocessing executor, which runs a server's workers as its own processes.
MP_BACKEND = ("--distributed-executor-backend", "mp")


def one_machine_args(world_size: int) -> list[str]:
    """A group on one machine is one server that starts its workers itself."""
    return list(MP_BACKEND) if world_size > 1 else []


def multi_node_args(world_size: int, rank: int | None, master_addr: str, master_port: int) -> list[str]:
    """vLLM's own multi-node launch for a group whose ranks are separate pods.

    `rank=None` is the pod template's form: the node rank comes from FROTA_RANK and
    the command turns on `--headless` off rank 0 (`launch` wraps it in a shell).
    """
    if world_size == 1:
        return []
    args = ["--nnodes", str(world_size), "--node-rank", RANK_FROM_ENV if rank is None else str(rank),
            "--master-addr", master_addr, "--master-port", str(master_port), *MP_BACKEND]
    if rank is not None and rank > 0:
        args.append("--headless")
    return args


def cpu_env(resources: Resources, kv_cache_bytes: int | None) -> dict[str, str]:
    """vLLM's CPU settings: the KV space the planner budgeted, threads left to the container."""
    if resources.accelerator is not None:
        return {}
    env = {
        # vLLM pins its threads to cores it picks itself; in a container (or beside other
        # ranks on one machine) the CPU share is the scheduler's business.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    if kv_cache_bytes:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.floor(kv_cache_bytes / GIB)))
    return env


def launch(spec: InferenceServiceSpec, parallelism: Parallelism, resources: Resources, *,
           model_path: str, port: int, master_addr: str, master_port: int,
           rank: int | None, kv_cache_bytes: int | None,
           server: tuple[str, ...] = SERVER, adapters: Sequence[tuple[str, str]] = (),
           addressing: Addressing = IN_PODS) -> Launch:
    """One rank of a vLLM group; `rank=None` renders the group's shared pod template.
    `adapters`: (name, local path) of each spec adapter. On one machine the group is one
    server (`one_machine_args`), and the addressing says where it listens."""
    world = parallelism.world_size
    together = addressing.one_machine
    args = addressing.server_args(
        (model_path, "--served-model-name", spec.model.name), ("--host", "0.0.0.0", "--port", str(port)),
        (*serve_args(spec, parallelism, resources, adapters),
         *(one_machine_args(world) if together else multi_node_args(world, rank, master_addr, master_port)),
         *spec.runtime.args),
        port)
    command = server
    if rank is None and world > 1 and not together:
        command = ("/bin/sh", "-c", HEADLESS_UNLESS_RANK_0, *server)
    return Launch(command=command, args=args, env={**cpu_env(resources, kv_cache_bytes), **lora_env(spec)},
                  live_path=ServingPath.HEALTH, ready_path=ServingPath.HEALTH)


def group(
    spec: InferenceServiceSpec, group_name: str, rs: RoleShape, replica: int, ordinal: int,
    path: str, budget: MemoryBudget | None, addressing: Addressing,
    adapters: tuple[AdapterLocation, ...] = (),
) -> ReplicaGroup:
    """One replica of a role: a vLLM server per rank (`path`: the model as vLLM reads it),
    or one server for them all on one machine; and the pod template the ranks share."""
    p = rs.parallelism
    processes = 1 if addressing.one_machine else p.world_size
    kv = budget.kv_cache_bytes_per_rank if budget is not None else None
    modules = tuple((a.name, a.path) for a in adapters)

    def launch_rank(rank: int | None, port: int) -> Launch:
        return launch(spec, p, rs.resources, model_path=path, port=port,
                      master_addr=addressing.master_addr(group_name),
                      master_port=addressing.master_port(ordinal), rank=rank, kv_cache_bytes=kv,
                      adapters=modules, addressing=addressing)

    ranks = []
    for index in range(processes):
        port = addressing.http_port(ordinal, index)
        one = launch_rank(index, port)
        ranks.append(Rank(index, one.args, {**one.env, Env.RANK: str(index)}, port, one.command,
                          addressing.process_env(ordinal, index, processes)))
    template = launch_rank(None, addressing.http_port(ordinal, 0))
    return ReplicaGroup(group_name, rs.role, replica, ordinal, p, tuple(ranks), rs.revision,
                        budget, template)


def describe(launch: Launch) -> str:
    """The launch as one shell line (what `frota plan` and logs show)."""
    return shlex.join(launch.argv)
