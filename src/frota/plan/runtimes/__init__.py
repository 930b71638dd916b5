"""How each runtime's server is launched for a rank: command, flags, environment, probes.

One pure module per runtime maps the same spec fields to that engine's flags. The
planner puts the result into the Topology; the builders render it into pods, and
`frota up` into local processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from frota.api import InferenceServiceSpec, LoRA, Resources
from frota.api.contract import ServingPath

#: Frota's runtime: the worker image's `frota` command (`frota worker ...`).
FROTA_COMMAND = ("frota",)


def resolve_dtype(spec: InferenceServiceSpec, resources: Resources) -> str:
    """The dtype planned for: `auto` is bfloat16 on an accelerator and float32 on CPU (the
    larger, so a CPU worker that picks bfloat16 fits its budget with room to spare)."""
    if spec.engine.dtype != "auto":
        return spec.engine.dtype
    return "bfloat16" if resources.accelerator is not None else "float32"


def worker_dtype(spec: InferenceServiceSpec, resources: Resources) -> str:
    """The dtype a Frota worker is told: `auto` stays `auto` on CPU, where the worker picks
    bfloat16 if its node's CPU computes it natively (the operator cannot see the node's
    CPU); elsewhere what `resolve_dtype` plans for."""
    if spec.engine.dtype == "auto" and resources.accelerator is None:
        return "auto"
    return resolve_dtype(spec, resources)


def lora_args(lora: LoRA | None, adapters: Sequence[tuple[str, str]]) -> list[str]:
    """The LoRA flags both runtimes share (vLLM's names): slots, rank, and each adapter as
    `name=path` after one `--lora-modules`; none when LoRA is off."""
    if lora is None:
        return []
    args = ["--enable-lora", "--max-loras", str(lora.maxAdapters), "--max-lora-rank", str(lora.maxRank)]
    if adapters:
        args += ["--lora-modules", *(f"{name}={path}" for name, path in adapters)]
    return args


@dataclass(frozen=True)
class Launch:
    """One rank's server process: `command + args` with `env`, probed on two paths."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    live_path: str = ServingPath.HEALTH
    ready_path: str = ServingPath.READY

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.command, *self.args)
