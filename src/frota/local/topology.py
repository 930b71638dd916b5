"""Manifest -> validated InferenceService -> the planner's topology, as plain local data.

This is the only module of `frota.local` that knows the API models and the
planner's shape (`frota.plan.planner`, `frota.plan.topology`);
everything downstream works on the small `LocalTopology` below. When the
planner's output changes, only this module changes.

The planner plans for this machine (`LocalAddressing`): every argument and variable
of a process is the plan's, and `frota up` runs them as they are.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from frota.api import InferenceService, ScaleToZero
from frota.api.contract import ALIAS_PACKAGES, ModelAlias, ModelScheme, ServingPath, WorkerRole
from frota.plan import planner
from frota.plan.addressing import LocalAddressing
from frota.plan.model_shapes import AdapterLocation
from frota.plan.runtimes import FROTA_COMMAND
from frota.plan.topology import ReplicaGroup, Topology
from frota.plan.validation import SpecError
from frota.plan.validation import load as validate


class ManifestError(ValueError):
    """The manifest is unreadable or invalid; the message is what the user sees."""


class UnsupportedLocally(ValueError):
    """The manifest asks for something this machine cannot give; one line says what."""


@dataclass(frozen=True)
class LocalRank:
    """One worker process: `command + args` with `env`, listening on `port` (the planner's,
    complete).

    `command` names the runtime's server as the images do (`frota`, or `vllm serve`);
    the fleet maps it to a program on this machine.
    """

    rank: int
    args: tuple[str, ...]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = FROTA_COMMAND


@dataclass(frozen=True)
class LocalGroup:
    """One replica group (all ranks of one model replica) of one role."""

    role: WorkerRole  # worker (colocated) | prefill | decode
    replica: int
    ranks: tuple[LocalRank, ...]
    live_path: str = ServingPath.HEALTH
    ready_path: str = ServingPath.READY

    @property
    def name(self) -> str:
        return f"{self.role}-{self.replica}"


@dataclass(frozen=True)
class LocalTopology:
    """What `frota up` runs: the worker groups and the router's flags and env."""

    name: str
    mode: str  # Colocated | Disaggregated
    served_model_name: str
    groups: tuple[LocalGroup, ...]
    # What was planned: `frota.local.fleet.build` plans it again on the ports it takes.
    isvc: InferenceService
    router_args: tuple[str, ...] = ()
    router_env: dict[str, str] = field(default_factory=dict)
    accelerators_per_rank: int = 0
    accelerator_resource: str | None = None
    notes: tuple[str, ...] = ()
    runtime: str = "frota"
    # Image-baked models the runtime reads as HF-layout directories: (alias, directory).
    conversions: tuple[tuple[str, str], ...] = ()
    # spec.autoscaling.minReplicas 0: stop the workers after this many idle seconds.
    idle_seconds: float | None = None
    # The router's hold flags when scaling to zero (scaleToZero's, or its defaults).
    hold_args: tuple[str, ...] = ()

    @property
    def max_world_size(self) -> int:
        return max((len(g.ranks) for g in self.groups), default=0)


def default_manifest_text() -> str:
    """The embedded default InferenceService (SmolLM2, one replica, CPU)."""
    return importlib.resources.files("frota.local").joinpath("default.yaml").read_text()


# `frota up --runtime vllm` on a CPU manifest that leaves these unset: what vLLM's CPU
# server needs (KV blocks of 32 tokens; ~2.5 GiB of its own besides weights and KV).
VLLM_CPU_DEFAULTS = {"blockSize": 32, "memory": "5Gi"}


def with_runtime(obj: dict, runtime: str, from_default: bool) -> dict:
    """The manifest with `spec.runtime.engine` set; on CPU, vLLM's block size where the
    manifest leaves it unset, and, for the built-in default, the memory vLLM needs."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("runtime", {})["engine"] = runtime
    if runtime == "vllm" and not (spec.get("resources") or {}).get("accelerator"):
        kv = spec.setdefault("engine", {}).setdefault("kvCache", {})
        kv.setdefault("blockSize", VLLM_CPU_DEFAULTS["blockSize"])
        if from_default:
            spec.setdefault("resources", {})["memory"] = VLLM_CPU_DEFAULTS["memory"]
    return obj


def with_adapters(obj: dict, adapters: Sequence[tuple[str, str]]) -> dict:
    """The manifest with each (name, local path) as a `file://` entry of spec.adapters
    (`frota up --adapter NAME=PATH`); one the manifest already names is replaced."""
    spec = obj.setdefault("spec", {})
    given = {name: {"name": name, "uri": "file://" + os.path.abspath(os.path.expanduser(path))}
             for name, path in adapters}
    kept = [a for a in spec.get("adapters") or [] if not (isinstance(a, dict) and a.get("name") in given)]
    spec["adapters"] = [*kept, *given.values()]
    return obj


def load(path: str | None, runtime: str | None = None,
         adapters: Sequence[tuple[str, str]] = ()) -> InferenceService:
    """Read and validate a manifest file (or the embedded default); `runtime` overrides
    `spec.runtime.engine` (`frota up --runtime`); `adapters` are added to spec.adapters
    (`frota up --adapter`)."""
    if path is None:
        text, origin = default_manifest_text(), "the built-in default"
    else:
        try:
            text, origin = Path(path).read_text(encoding="utf-8"), path
        except OSError as exc:
            raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{origin} is not valid YAML: {exc}") from exc
    services = [d for d in docs if isinstance(d, dict) and d.get("kind") == "InferenceService"]
    if len(services) != 1:
        raise ManifestError(
            f"{origin} must hold exactly one InferenceService (found {len(services)})"
        )
    obj = services[0]
    if runtime is not None:
        obj = with_runtime(obj, runtime, from_default=path is None)
    if adapters:
        obj = with_adapters(obj, adapters)
    try:
        return validate(obj)
    except SpecError as exc:
        raise ManifestError(_invalid(obj, exc)) from exc


def _invalid(obj: dict, exc: SpecError) -> str:
    """Field-level lines, in the form the apiserver uses for the same object."""
    name = (obj.get("metadata") or {}).get("name", "?")
    return "\n".join([f'InferenceService "{name}" is invalid:', *(f"  {e}" for e in exc.errors)])


def converted_models_dir() -> Path:
    """Where `frota up` keeps HF-layout copies of image-baked models (`frota convert`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "frota" / "converted"


def _local_group(topo: Topology, g: ReplicaGroup, user_env: dict[str, str]) -> LocalGroup:
    ranks = tuple(LocalRank(r.index, tuple(r.args), r.http_port, topo.rank_env(g, r, user_env),
                            tuple(r.command))
                  for r in g.ranks)
    return LocalGroup(role=g.role, replica=g.replica, ranks=ranks,
                      live_path=g.pod.live_path, ready_path=g.pod.ready_path)


def plan(isvc: InferenceService, addressing: LocalAddressing | None = None) -> LocalTopology:
    """The planner's topology of `isvc` on this machine, checked for what it can run.

    Without `addressing` no port is taken yet (every port is 0): the plan says which
    processes run, and `frota.local.fleet.build` plans them again on the ports it takes.
    """
    converted = converted_models_dir()
    try:
        topo = planner.plan(isvc, addressing or LocalAddressing(), converted_dir=str(converted))
    except SpecError as exc:
        raise ManifestError(_invalid(isvc.to_wire(), exc)) from exc
    _check_model(topo.model.uri, topo.model.delivery)
    _check_adapters(topo.adapters)
    user_env = _engine_env(isvc)
    spec = isvc.spec
    runtime = spec.runtime.engine
    groups = tuple(_local_group(topo, g, user_env) for g in topo.groups)
    conversions = ()
    if runtime == "vllm" and topo.model.delivery == "image":
        alias = topo.model.model_arg
        conversions = ((alias, str(converted / alias)),)
    notes = list(topo.warnings)
    world = max((g.sharding.world_size for g in topo.groups), default=1)
    if runtime == "vllm" and world > 1:
        notes.append(f"runtime vllm: each group is one vLLM server with {world} "
                     "workers of its own (vLLM's single-machine parallelism)")
    if topo.router.replicas > 1:
        notes.append(f"spec.router.replicas={topo.router.replicas}: one router runs locally")
    to_zero = spec.autoscaling.scale_to_zero() if spec.autoscaling is not None else None
    hold = to_zero or ScaleToZero()
    if to_zero is not None:
        notes.append(f"spec.autoscaling: replicas stay at spec.replicas locally; the workers "
                     f"stop after {to_zero.idleSeconds} s without a request (scaleToZero)")
    elif spec.autoscaling is not None:
        notes.append("spec.autoscaling is ignored locally (replicas stay at spec.replicas)")
    if spec.router.apiKeySecret is not None:
        notes.append("spec.router.apiKeySecret is ignored locally (no API key is required)")
    accel = spec.resources.accelerator
    if spec.disaggregation is not None:
        role_accels = [r.resources.accelerator for r in (spec.disaggregation.prefill,
                                                         spec.disaggregation.decode) if r.resources]
        accel = accel or next((a for a in role_accels if a is not None), None)
    return LocalTopology(
        name=topo.name, mode=topo.mode, served_model_name=topo.served_model_name,
        groups=groups,
        isvc=isvc,
        router_args=("--policy", topo.router.policy, *topo.router.args),
        router_env=dict(topo.router.env),
        accelerators_per_rank=accel.count if accel else 0,
        accelerator_resource=accel.resourceName if accel else None,
        notes=tuple(notes),
        runtime=runtime,
        conversions=conversions,
        idle_seconds=float(to_zero.idleSeconds) if to_zero is not None else None,
        hold_args=("--hold-seconds", str(hold.holdSeconds),
                   "--max-held-requests", str(hold.maxHeldRequests)),
    )


def _check_model(uri: str, delivery: str) -> None:
    """Models `frota up` can serve: aliases installed here, and synthetic ones."""
    if delivery == "synthetic":
        return
    if delivery == "image":
        package = ALIAS_PACKAGES.get(uri.removeprefix(ModelScheme.ALIAS))
        if package is not None and importlib.util.find_spec(package.package) is None:
            raise UnsupportedLocally(
                f"model {uri} is not installed: run `{package.install}` (scripts/up.sh does it for you)"
            )
        return
    scheme = uri.split(":", 1)[0]
    raise UnsupportedLocally(
        f"model {uri}: {scheme}:// models need a cluster; `frota up` serves {ModelScheme.ALIAS} and "
        f"{ModelScheme.SYNTHETIC} models (e.g. {ModelScheme.ALIAS}{ModelAlias.SMOLLM2})"
    )


def _check_adapters(adapters: Sequence[AdapterLocation]) -> None:
    """Adapters `frota up` can serve: directories on this machine (`file://`, `--adapter`)."""
    for adapter in adapters:
        if adapter.delivery != "local":
            scheme = adapter.uri.split(":", 1)[0]
            raise UnsupportedLocally(
                f"adapter {adapter.name} ({adapter.uri}): {scheme}:// adapters need a cluster; "
                f"`frota up` serves adapter directories on this machine: --adapter {adapter.name}=PATH "
                "or a file:///PATH uri"
            )
        if not Path(adapter.path).is_dir():
            raise UnsupportedLocally(
                f"adapter {adapter.name}: {adapter.path} is not a directory (a PEFT adapter: "
                "adapter_config.json and adapter_model.safetensors)"
            )


def _engine_env(isvc: InferenceService) -> dict[str, str]:
    """spec.engine.env as literal values (Secrets and ConfigMaps need a cluster)."""
    env = {}
    for var in isvc.spec.engine.env:
        if var.valueFrom is not None:
            raise UnsupportedLocally(
                f"spec.engine.env {var.name}: valueFrom (a Secret or ConfigMap) needs a "
                "cluster; give a value instead"
            )
        env[var.name] = var.value or ""
    return env
