"""The frota runtime: the same spec fields as `frota worker`'s flags and environment.

Mapped:

| spec field                                   | `frota worker`                                      |
|----------------------------------------------|-----------------------------------------------------|
| model (where the worker reads it)            | `--model`                                           |
| the pod's role (worker, prefill, decode)     | `--role` both, prefill or decode                    |
| model.name                                   | `FROTA_SERVED_MODEL_NAME`                           |
| engine.scheduler.maxNumSeqs / BatchedTokens  | `FROTA_MAX_NUM_SEQS`, `FROTA_MAX_NUM_BATCHED_TOKENS`|
| engine.scheduler.maxQueue                    | `FROTA_MAX_QUEUE`                                   |
| engine.kvCache.blockSize / prefixCaching     | `FROTA_BLOCK_SIZE`, `FROTA_ENABLE_PREFIX_CACHING`   |
| engine.quantization.weights / kvCache        | `FROTA_QUANTIZATION`, `FROTA_KV_CACHE_DTYPE`        |
| engine.maxModelLen                           | `FROTA_MAX_MODEL_LEN`                               |
| disaggregation.minPromptTokens               | `FROTA_MIN_PREFILL_TOKENS`                          |
| engine.dtype (`auto` stays `auto` on CPU)    | `FROTA_DTYPE`                                       |
| resources.accelerator                        | `FROTA_DEVICE` (cuda or cpu)                        |
| parallelism.tensor / pipeline / expert       | `FROTA_*_PARALLEL_SIZE`, `FROTA_WORLD_SIZE`, a process per rank |
| the planner's KV budget                      | `FROTA_KV_CACHE_MEMORY` (bytes per rank)            |
| engine.lora (or spec.adapters' defaults)     | `--enable-lora`, `--max-loras`, `--max-lora-rank`   |
| spec.adapters (each name, its local path)    | `--lora-modules name=path ...`                      |
| engine.lora.allowRuntimeLoading              | `--allow-runtime-lora`                              |
| engine.extraArgs                             | appended last                                       |
| (where it listens: the addressing's)         | `--port` (in a pod); `--host`, `--port` last on one machine |

The engine environment is the same for every rank of every group (in a cluster, one
ConfigMap); each group adds its sharding, and each rank its index.
"""

from __future__ import annotations

from frota.api import InferenceServiceSpec
from frota.api.contract import EngineRole, Env, Role, WorkerRole
from frota.plan.addressing import Addressing
from frota.plan.memory import MemoryBudget
from frota.plan.model_shapes import AdapterLocation
from frota.plan.runtimes import lora_args, worker_dtype
from frota.plan.topology import Rank, ReplicaGroup, RoleShape

# What Frota's engine is told it does in each role (`frota worker --role`).
ENGINE_ROLE: dict[WorkerRole, EngineRole] = {
    Role.WORKER: EngineRole.BOTH, Role.PREFILL: EngineRole.PREFILL, Role.DECODE: EngineRole.DECODE}


def engine_env(spec: InferenceServiceSpec) -> dict[str, str]:
    """What every rank of every group reads from its environment, from the spec alone."""
    engine = spec.engine
    env = {
        "FROTA_SERVED_MODEL_NAME": spec.model.name,
        "FROTA_MAX_NUM_SEQS": str(engine.scheduler.maxNumSeqs),
        "FROTA_MAX_NUM_BATCHED_TOKENS": str(engine.scheduler.maxNumBatchedTokens),
        "FROTA_MAX_QUEUE": str(engine.scheduler.maxQueue),
        "FROTA_BLOCK_SIZE": str(engine.kvCache.blockSize),
        "FROTA_ENABLE_PREFIX_CACHING": "true" if engine.kvCache.prefixCaching else "false",
        "FROTA_QUANTIZATION": engine.quantization.weights,
        "FROTA_KV_CACHE_DTYPE": engine.quantization.kvCache,
    }
    if engine.maxModelLen is not None:
        env["FROTA_MAX_MODEL_LEN"] = str(engine.maxModelLen)
    if spec.disaggregation is not None:
        env[Env.MIN_PREFILL_TOKENS] = str(spec.disaggregation.minPromptTokens)
    return env


def worker_lora_args(spec: InferenceServiceSpec, adapters: tuple[AdapterLocation, ...]) -> list[str]:
    """`frota worker`'s LoRA flags: vLLM's names, and `--allow-runtime-lora` for runtime loading."""
    args = lora_args(spec.lora, [(a.name, a.path) for a in adapters])
    if spec.lora is not None and spec.lora.allowRuntimeLoading:
        args.append("--allow-runtime-lora")
    return args


def group(
    spec: InferenceServiceSpec, group_name: str, rs: RoleShape, replica: int, ordinal: int,
    model_arg: str, budget: MemoryBudget | None, addressing: Addressing,
    adapters: tuple[AdapterLocation, ...] = (),
) -> ReplicaGroup:
    """One replica of a role: a `frota worker` process per rank, meeting at rank 0."""
    p = rs.parallelism
    world = p.world_size
    group_env = {
        Env.WORLD_SIZE: str(world),
        Env.MASTER_ADDR: addressing.master_addr(group_name),
        Env.MASTER_PORT: str(addressing.master_port(ordinal)),
        "FROTA_TENSOR_PARALLEL_SIZE": str(p.tensor),
        "FROTA_PIPELINE_PARALLEL_SIZE": str(p.pipeline),
        "FROTA_EXPERT_PARALLEL_SIZE": str(p.expert),
        "FROTA_DTYPE": worker_dtype(spec, rs.resources),
        "FROTA_DEVICE": "cuda" if rs.resources.accelerator else "cpu",
    }
    if budget is not None and budget.kv_cache_bytes_per_rank:
        group_env["FROTA_KV_CACHE_MEMORY"] = str(budget.kv_cache_bytes_per_rank)
    ranks = []
    for index in range(world):
        port = addressing.http_port(ordinal, index)
        args = addressing.server_args(
            ("worker", "--model", model_arg), ("--port", str(port)),
            ("--role", ENGINE_ROLE[rs.role], *worker_lora_args(spec, adapters), *spec.engine.extraArgs),
            port)
        ranks.append(Rank(index, args, {**group_env, Env.RANK: str(index)}, port,
                          process_env=addressing.process_env(ordinal, index, world)))
    return ReplicaGroup(group_name, rs.role, replica, ordinal, p, tuple(ranks), rs.revision,
                        budget)
