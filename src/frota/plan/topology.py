"""The planner's output: what runs, independent of Kubernetes or local processes.

`frota up` starts each rank as a local process; the builders turn each group
into a StatefulSet. Both read the same Topology.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from frota.api import Parallelism, Resources
from frota.api.contract import Role, WorkerRole
from frota.plan.memory import MemoryBudget
from frota.plan.model_shapes import AdapterLocation, ModelLocation
from frota.plan.runtimes import FROTA_COMMAND, Launch


@dataclass(frozen=True)
class RoleShape:
    """Sharding, resources, groups and revision of one role, with the field paths they came from.

    The planner works these out once per plan; the builders and the reconciler
    read them from the Topology instead of deriving them from the spec again.
    """

    role: WorkerRole
    units: int  # spec.replicas
    groups_per_unit: int  # 1 colocated; the role's own replicas when disaggregated
    parallelism: Parallelism
    resources: Resources
    parallelism_field: str
    resources_field: str
    revision: str  # hash of everything that changes the role's pods

    @property
    def groups(self) -> int:
        return self.units * self.groups_per_unit


@dataclass(frozen=True)
class Rank:
    """One worker process: `command + args` with `env` on top of the topology's engine env.

    `command` is the runtime's server as the image names it: `frota` (Frota's runtime,
    `args` starting with `worker`) or `vllm serve`; `frota up` maps it to a local program.
    `process_env` is what the addressing tells the process of where it runs (empty in a
    cluster, where the builders take it from the pod); it goes over every other variable.
    """

    index: int
    args: tuple[str, ...]
    env: Mapping[str, str]
    http_port: int
    command: tuple[str, ...] = FROTA_COMMAND
    process_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplicaGroup:
    """The ranks of one replica of one role; they start, serve and are replaced together."""

    name: str
    role: WorkerRole
    replica: int  # index within the role
    ordinal: int  # index within the topology
    sharding: Parallelism
    ranks: tuple[Rank, ...]
    revision: str
    budget: MemoryBudget | None
    # What every pod of the group runs (one template; the rank comes from FROTA_RANK),
    # and the paths its probes ask. None: the leader's command and args, Frota's probes.
    template: Launch | None = None

    @property
    def pod(self) -> Launch:
        """The group's pod template launch."""
        if self.template is not None:
            return self.template
        return Launch(self.leader.command, self.leader.args)

    @property
    def leader(self) -> Rank:
        return self.ranks[0]

    @property
    def world_size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class RouterPlan:
    """The router in front of the groups."""

    replicas: int
    policy: str
    env: Mapping[str, str]
    # The flags the spec sets beyond the policy: request validation in front of vLLM
    # (`--validate-requests`), LoRA runtime loading (`--lora-runtime-loading`, `--adapters`).
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """Everything that runs for one InferenceService."""

    name: str
    mode: Literal["Colocated", "Disaggregated"]
    served_model_name: str
    model: ModelLocation
    engine_env: Mapping[str, str]  # shared by every rank of every group
    groups: tuple[ReplicaGroup, ...]
    router: RouterPlan
    role_shapes: tuple[RoleShape, ...]  # one per role: prefill, decode; or worker
    warnings: tuple[str, ...] = field(default=())
    adapters: tuple[AdapterLocation, ...] = ()  # spec.adapters, where each worker reads them
    # The model-cache Job converts the model (GGUF, for vLLM) into the claim, so no pod
    # converts: the builders read the planner's answer rather than asking it again.
    converts_into_cache: bool = False

    def groups_of(self, role: WorkerRole) -> tuple[ReplicaGroup, ...]:
        return tuple(g for g in self.groups if g.role == role)

    def shape_of(self, role: str) -> RoleShape:
        """The shape of one role (KeyError for a role the topology does not have)."""
        for shape in self.role_shapes:
            if shape.role == role:
                return shape
        raise KeyError(role)

    @property
    def revisions(self) -> dict[str, str]:
        """The revision of each role, also for a role scaled to zero groups."""
        return {shape.role: shape.revision for shape in self.role_shapes}

    @property
    def roles(self) -> tuple[WorkerRole, ...]:
        return tuple(shape.role for shape in self.role_shapes)

    @property
    def serving_role(self) -> WorkerRole:
        """The role that holds sequences to the end and answers clients: decode, or the
        colocated worker (its rank-0 pods are the scale subresource's selector)."""
        return Role.DECODE if self.mode == "Disaggregated" else Role.WORKER

    @property
    def serving_budget(self) -> MemoryBudget | None:
        """The budget of the serving role (None when its shape is unknown or it has no groups)."""
        groups = self.groups_of(self.serving_role)
        return groups[0].budget if groups else None

    def rank_env(self, group: ReplicaGroup, rank: Rank,
                 user_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment of one rank process: the engine env, the rank's own,
        `user_env` (spec.engine.env's values, where the caller has them), then where the
        process runs."""
        return {**self.engine_env, **rank.env, **(user_env or {}), **rank.process_env}
