"""Plan an InferenceService: roles, replica groups, ranks, memory budget, semantic checks.

Pure: no Kubernetes client, no torch. The builders render the Topology into
child objects; `frota up` runs it as local processes.
"""

from __future__ import annotations

import hashlib
import json

from frota.api import InferenceService, InferenceServiceSpec, Parallelism, Resources
from frota.api.contract import Env, Role, WorkerRole
from frota.api.memory import ModelShape
from frota.api.runtime import Runtime
from frota.plan.addressing import Addressing, KubernetesAddressing
from frota.plan.memory import MemoryBudget, role_budget
from frota.plan.model_shapes import (
    CACHE_DIR,
    CACHED_CONVERSION,
    CONVERTED_DIR,
    AdapterLocation,
    ModelLocation,
    UnknownModelError,
    locate,
    locate_adapter,
)
from frota.plan.quantity import format_bytes
from frota.plan.runtimes import frota, vllm
from frota.plan.topology import (
    ReplicaGroup,
    RoleShape,
    RouterPlan,
    Topology,
)
from frota.plan.validation import FieldError, SpecError


def revision(spec: InferenceServiceSpec, role: WorkerRole, parallelism: Parallelism,
             resources: Resources) -> str:
    """Hash of everything that changes a role's pods; a group never mixes two revisions."""
    parts = {
        "role": role,
        "model": spec.model.to_wire(),
        "engine": spec.engine.to_wire(),
        "parallelism": parallelism.to_wire(),
        "resources": resources.to_wire(),
        "placement": spec.placement.to_wire(),
        "minPromptTokens": spec.disaggregation.minPromptTokens if spec.disaggregation else None,
    }
    if spec.runtime != Runtime():  # left out by default, so the revisions of frota specs hold
        parts["runtime"] = spec.runtime.to_wire()
    if spec.adapters:  # likewise: specs without adapters keep their revisions
        parts["adapters"] = [a.to_wire() for a in spec.adapters]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def _shape(spec: InferenceServiceSpec, role: WorkerRole, groups_per_unit: int, parallelism: Parallelism,
           resources: Resources, parallelism_field: str, resources_field: str) -> RoleShape:
    return RoleShape(role, spec.replicas, groups_per_unit, parallelism, resources, parallelism_field,
                     resources_field, revision(spec, role, parallelism, resources))


def role_shapes(spec: InferenceServiceSpec) -> tuple[RoleShape, ...]:
    """The roles of a spec with their effective parallelism, resources, groups and revision."""
    if spec.disaggregation is None:
        return (_shape(spec, Role.WORKER, 1, spec.parallelism, spec.resources,
                       "spec.parallelism", "spec.resources"),)
    out = []
    for role in (Role.PREFILL, Role.DECODE):
        override = getattr(spec.disaggregation, role)
        base = f"spec.disaggregation.{role}"
        out.append(_shape(
            spec, role, override.replicas,
            override.parallelism or spec.parallelism,
            override.resources or spec.resources,
            f"{base}.parallelism" if override.parallelism else "spec.parallelism",
            f"{base}.resources" if override.resources else "spec.resources",
        ))
    return tuple(out)


def _check_shape(shape: ModelShape, rs: RoleShape, model: str) -> list[FieldError]:
    p, errors = rs.parallelism, []
    field = rs.parallelism_field
    if shape.num_heads % p.tensor:
        errors.append(FieldError(f"{field}.tensor",
                                 f"{p.tensor} does not divide the {shape.num_heads} attention heads of {model}"))
    elif shape.num_kv_heads % p.tensor and p.tensor % shape.num_kv_heads:
        errors.append(FieldError(f"{field}.tensor",
                                 f"{p.tensor} neither divides nor is a multiple of the "
                                 f"{shape.num_kv_heads} KV heads of {model}"))
    if shape.intermediate_size % p.tensor:  # each expert's, for a mixture of experts
        errors.append(FieldError(f"{field}.tensor",
                                 f"{p.tensor} does not divide the MLP size {shape.intermediate_size} of {model}"))
    if shape.num_layers % p.pipeline:
        errors.append(FieldError(f"{field}.pipeline",
                                 f"{p.pipeline} does not divide the {shape.num_layers} layers of {model}"))
    if p.expert > 1 and not shape.is_moe:
        errors.append(FieldError(f"{field}.expert",
                                 f"{p.expert} needs a mixture-of-experts model; {model} is dense"))
    elif shape.is_moe and shape.num_experts % p.expert:
        errors.append(FieldError(f"{field}.expert",
                                 f"{p.expert} does not divide the {shape.num_experts} experts of {model}"))
    return errors


def _memory_error(rs: RoleShape, budget: MemoryBudget, memory_fraction: float) -> FieldError | None:
    """The role's memory field when not one sequence of maxModelLen tokens fits a replica."""
    if budget.sequences_at_max_model_len != 0 or budget.rank_memory_bytes is None:
        return None
    what = (f"{rs.resources_field}.accelerator.memory" if rs.resources.accelerator
            else f"{rs.resources_field}.memory")
    runtime = (f" and {format_bytes(budget.runtime_overhead_bytes)} of runtime"
               if budget.runtime_overhead_bytes else "")
    if budget.adapter_bytes_per_rank:
        runtime += (f" and {format_bytes(budget.adapter_bytes_per_rank)} of adapter slots "
                    "(spec.engine.lora)")
    return FieldError(what, (
        f"{format_bytes(budget.rank_memory_bytes)} per rank x memoryFraction "
        f"{memory_fraction} leaves {format_bytes(budget.kv_cache_bytes_per_rank or 0)} "
        f"for KV cache after {format_bytes(budget.weight_bytes_per_rank)} of weights{runtime}"
        f": not one sequence of {budget.max_model_len} tokens fits; raise it, shard further, "
        f"or lower spec.engine.maxModelLen"))


# In a model cache (spec.model.cache), the HF-layout copy the fill Job converted.


def converts_into_cache(spec: InferenceServiceSpec, location: ModelLocation) -> bool:
    """Whether the model-cache Job converts the model for vLLM: a GGUF model (image-baked,
    or a downloaded .gguf) with the vllm runtime and spec.model.cache on. Then the claim
    holds the converted form and no pod converts."""
    cache = spec.model.cache
    if spec.runtime.engine != "vllm" or cache is None or not cache.enabled:
        return False
    return location.delivery == "image" or (
        location.delivery == "download" and location.model_arg.endswith(".gguf"))


def model_path(location: ModelLocation, spec: InferenceServiceSpec, converted_dir: str) -> str:
    """What the runtime's server is given as its model.

    Frota's runtime reads every delivery itself (an alias's GGUF from the image). vLLM
    reads HF-layout checkpoints, so a GGUF model is served from its converted copy: the
    model cache's (converted once by its Job), else an image-baked model's (`frota
    convert`, run by an init container, or by `frota up`).
    """
    if converts_into_cache(spec, location) and converted_dir == CONVERTED_DIR:
        # In a cluster; `frota up` has no claim and converts into its own converted_dir.
        return f"{CACHE_DIR}/{CACHED_CONVERSION}"
    if spec.runtime.engine == "vllm" and location.delivery == "image":
        return f"{converted_dir}/{location.model_arg}"
    return location.model_arg


def router_args(spec: InferenceServiceSpec, adapters: tuple[AdapterLocation, ...]) -> tuple[str, ...]:
    """The router's flags beyond its policy.

    In front of vLLM it validates request bodies as Frota's workers do, so the fleet's
    endpoint refuses the same requests whatever the runtime. With scale to zero it holds
    requests while a replica starts (who it tells is the deployment's: the operator's
    builder, `frota up`). With runtime loading on, it
    serves the load and unload routes, loads on demand, and knows where the workers read
    the spec's adapters."""
    args: tuple[str, ...] = ("--validate-requests",) if spec.runtime.engine == "vllm" else ()
    to_zero = spec.autoscaling.scale_to_zero() if spec.autoscaling is not None else None
    if to_zero is not None:  # hold requests while a replica starts from zero
        args += ("--hold-seconds", str(to_zero.holdSeconds),
                 "--max-held-requests", str(to_zero.maxHeldRequests))
    if spec.lora is None or not spec.lora.allowRuntimeLoading:
        return args
    args += ("--lora-runtime-loading",)
    if adapters:
        args += ("--adapters", ",".join(f"{a.name}={a.path}" for a in adapters))
    return args


def _adapters(spec: InferenceServiceSpec) -> tuple[AdapterLocation, ...]:
    """Where each worker reads spec.adapters; SpecError naming the adapter's uri."""
    errors, found = [], []
    for i, adapter in enumerate(spec.adapters):
        try:
            found.append(locate_adapter(adapter.name, adapter.uri))
        except UnknownModelError as exc:
            errors.append(FieldError(f"spec.adapters[{i}].uri", str(exc)))
    if errors:
        raise SpecError(errors)
    return tuple(found)


def _group(
    spec: InferenceServiceSpec, name: str, rs: RoleShape, replica: int, ordinal: int,
    location: ModelLocation, budget: MemoryBudget | None, addressing: Addressing,
    converted_dir: str = CONVERTED_DIR, adapters: tuple[AdapterLocation, ...] = (),
) -> ReplicaGroup:
    """One replica of a role, as its runtime runs it."""
    group_name = f"{name}-{rs.role}-{replica}"
    if spec.runtime.engine == "vllm":
        path = model_path(location, spec, converted_dir)
        return vllm.group(spec, group_name, rs, replica, ordinal, path, budget, addressing, adapters)
    return frota.group(spec, group_name, rs, replica, ordinal, location.model_arg, budget, addressing,
                       adapters)


def _budgets(spec: InferenceServiceSpec, shapes: tuple[RoleShape, ...], location: ModelLocation,
             ) -> dict[str, MemoryBudget]:
    """Each role's memory budget, once; raises SpecError for what the schema cannot express
    (parallel sizes the model does not divide into, a context or memory too small)."""
    shape = location.shape
    if shape is None:
        return {}
    model = spec.model.uri.split(":", 1)[1]
    errors: list[FieldError] = []
    max_len = spec.engine.maxModelLen or shape.max_position
    if max_len > shape.max_position:
        errors.append(FieldError("spec.engine.maxModelLen",
                                 f"{max_len} exceeds the {shape.max_position}-token context of {model}"))
    for rs in shapes:
        errors += [e for e in _check_shape(shape, rs, model) if e not in errors]
    if errors:
        raise SpecError(errors)
    overhead = vllm.CPU_RUNTIME_OVERHEAD_BYTES if spec.runtime.engine == "vllm" else None
    budgets = {rs.role: role_budget(spec, shape, rs.parallelism, rs.resources, max_len, overhead)
               for rs in shapes}
    memory_errors = [_memory_error(rs, budgets[rs.role], spec.engine.kvCache.memoryFraction) for rs in shapes]
    if any(memory_errors):
        raise SpecError(e for e in memory_errors if e is not None)
    return budgets


def plan(isvc: InferenceService, addressing: Addressing | None = None,
         converted_dir: str = CONVERTED_DIR) -> Topology:
    """The topology of an InferenceService; raises SpecError naming the fields at fault.

    `addressing`: where the ranks run, a cluster's pods (the default) or one machine's
    processes (`frota up`'s `LocalAddressing`); the plan is complete for either.
    `converted_dir`: where HF-layout copies of image-baked models are, for runtimes that
    need them (the init container's volume in a pod; a cache directory for `frota up`).
    """
    addressing = addressing or KubernetesAddressing()
    spec, name = isvc.spec, isvc.metadata.name
    try:
        location = locate(spec.model.uri)
    except UnknownModelError as exc:
        raise SpecError([FieldError("spec.model.uri", str(exc))]) from None
    adapters = _adapters(spec)
    shapes = role_shapes(spec)
    budgets = _budgets(spec, shapes, location)
    warnings = () if location.shape else (
        f"spec.model.uri: the shape of {spec.model.uri} is known only once a worker "
        "loads it; parallel sizes and memory are checked then",)
    groups: list[ReplicaGroup] = []
    for rs in shapes:
        for replica in range(rs.groups):
            groups.append(_group(spec, name, rs, replica, len(groups), location, budgets.get(rs.role),
                                 addressing, converted_dir, adapters))
    router_env = {
        "FROTA_MAX_INFLIGHT": str(spec.router.admission.maxInflight),
        "FROTA_MAX_QUEUE": str(spec.router.admission.maxQueue),
    }
    if spec.disaggregation is not None:
        router_env[Env.MIN_PREFILL_TOKENS] = str(spec.disaggregation.minPromptTokens)
    return Topology(
        name=name,
        mode="Disaggregated" if spec.disaggregation else "Colocated",
        served_model_name=spec.model.name,
        model=location,
        engine_env=frota.engine_env(spec) if spec.runtime.engine == "frota" else {},
        groups=tuple(groups),
        router=RouterPlan(spec.router.replicas, spec.router.policy, {**router_env, **addressing.fleet_env},
                          router_args(spec, adapters)),
        role_shapes=shapes,
        warnings=warnings,
        adapters=adapters,
        converts_into_cache=converts_into_cache(spec, location),
    )
