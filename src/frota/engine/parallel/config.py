"""The shape of a parallel group and where one rank sits in it (pure: no torch import).

World = tensor x pipeline. Ranks are numbered stage-major: rank = stage * tensor + tp_rank,
so rank 0 is the first tensor rank of the first stage. Expert parallelism lives inside the
tensor group: its `tensor` ranks form `expert` groups of `tensor // expert` ranks, each group
holding `num_experts // expert` whole experts, sharded over the ranks of the group.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from frota.api.contract import Env


class ParallelConfigError(ValueError):
    """Sizes that do not fit the model or the group; the message names them."""


@dataclass(frozen=True)
class ParallelConfig:
    """Sizes of the group and this rank's place; `from_env` reads the planner's contract."""

    tensor: int = 1
    pipeline: int = 1
    expert: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    capacity_factor: float | None = None  # MoE: None means no token is ever dropped
    timeout_s: float = 30.0  # collectives; a dead peer is noticed within this time

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            if getattr(self, name) < 1:
                raise ParallelConfigError(f"{name}-parallel size must be >= 1, got {getattr(self, name)}")
        if self.tensor % self.expert:
            raise ParallelConfigError(
                f"expert-parallel size {self.expert} must divide tensor-parallel size {self.tensor}: "
                "expert groups are made of the tensor-parallel ranks")
        if not 0 <= self.rank < self.world_size:
            raise ParallelConfigError(f"rank {self.rank} is outside a world of {self.world_size} ranks")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ParallelConfigError(f"capacity factor must be > 0, got {self.capacity_factor}")

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    # Where this rank sits. Ranks are numbered stage-major; a stage's tensor group splits
    # into `expert` groups of `expert_tp` ranks.
    stage = property(lambda self: self.rank // self.tensor, doc="This rank's pipeline stage.")
    tp_rank = property(lambda self: self.rank % self.tensor,
                       doc="This rank's place in its stage's tensor group.")
    expert_tp = property(lambda self: self.tensor // self.expert,
                         doc="Ranks an expert is sharded over.")
    ep_rank = property(lambda self: self.tp_rank // self.expert_tp,
                       doc="Which expert group this rank belongs to.")
    expert_tp_rank = property(lambda self: self.tp_rank % self.expert_tp,
                              doc="This rank's place in its expert group.")

    def stage_ranks(self, stage: int) -> list[int]:
        return [stage * self.tensor + t for t in range(self.tensor)]

    def fingerprint(self, model_fields: dict) -> dict:
        """What every rank must agree on at join time (rank and port excluded)."""
        mine = asdict(self)
        mine.pop("rank")
        return {"parallel": mine, **model_fields}

    @classmethod
    def from_env(cls, tensor: int = 1, pipeline: int = 1, expert: int = 1,
                 capacity_factor: float | None = None, environ: dict | None = None) -> ParallelConfig:
        """Sizes from flags; rank and master from FROTA_* (or the torch names)."""
        env = os.environ if environ is None else environ

        def get(*names: str, default: str) -> str:
            for name in names:
                if env.get(name):
                    return env[name]
            return default

        world = int(get(Env.WORLD_SIZE, Env.TORCH_WORLD_SIZE, default=str(tensor * pipeline)))
        if world != tensor * pipeline:
            raise ParallelConfigError(
                f"{Env.WORLD_SIZE}={world} but tensor-parallel size {tensor} x pipeline-parallel "
                f"size {pipeline} = {tensor * pipeline}; the planner and the flags disagree")
        return cls(
            tensor=tensor, pipeline=pipeline, expert=expert,
            rank=int(get(Env.RANK, Env.TORCH_RANK, default="0")),
            master_addr=get(Env.MASTER_ADDR, Env.TORCH_MASTER_ADDR, default="127.0.0.1"),
            master_port=int(get(Env.MASTER_PORT, Env.TORCH_MASTER_PORT, default="29500")),
            capacity_factor=capacity_factor,
            timeout_s=float(get("FROTA_COLLECTIVE_TIMEOUT", default="30")),
        )


def validate_model(pc: ParallelConfig, *, num_heads: int, num_kv_heads: int, num_layers: int,
                   intermediate_size: int, num_experts: int) -> None:
    """Raise ParallelConfigError naming the sizes when the model cannot be split this way."""
    t = pc.tensor
    if num_heads % t:
        raise ParallelConfigError(
            f"tensor-parallel size {t} does not divide the model's {num_heads} attention heads; "
            f"use a size that divides {num_heads}")
    if num_kv_heads % t and t % num_kv_heads:
        raise ParallelConfigError(
            f"tensor-parallel size {t} and the model's {num_kv_heads} KV heads: one must divide "
            "the other (KV heads are split, or replicated when there are fewer than ranks)")
    if num_layers % pc.pipeline:
        raise ParallelConfigError(
            f"pipeline-parallel size {pc.pipeline} does not divide the model's {num_layers} layers")
    if num_experts:
        if num_experts % pc.expert:
            raise ParallelConfigError(
                f"expert-parallel size {pc.expert} does not divide the model's {num_experts} experts")
        if intermediate_size % pc.expert_tp:
            raise ParallelConfigError(
                f"each expert is sharded over {pc.expert_tp} ranks (tensor {t} / expert {pc.expert}), "
                f"which does not divide the expert intermediate size {intermediate_size}")
    elif pc.expert > 1:
        raise ParallelConfigError(
            f"expert-parallel size {pc.expert} needs a mixture-of-experts model; this one is dense")
    elif intermediate_size % t:
        raise ParallelConfigError(
            f"tensor-parallel size {t} does not divide the MLP intermediate size {intermediate_size}")


def stage_layers(pc: ParallelConfig, num_layers: int, stage: int | None = None) -> range:
    """The contiguous layers of a stage (this rank's by default)."""
    per = num_layers // pc.pipeline
    s = pc.stage if stage is None else stage
    return range(s * per, (s + 1) * per)
