"""A Topology in words (what `frota plan` prints)."""

from __future__ import annotations

import shlex

from frota.api import InferenceService
from frota.plan.memory import MemoryBudget
from frota.plan.quantity import format_bytes
from frota.plan.topology import Topology


def _budget_lines(budget: MemoryBudget | None) -> list[str]:
    if budget is None:
        return ["    memory: model shape unknown until a worker loads it"]
    lines = [
        f"    weights per rank: {format_bytes(budget.weight_bytes_per_rank)}",
        f"    KV cache per token per rank: {budget.kv_bytes_per_token_per_rank} B",
    ]
    if budget.adapter_slots:  # LoRA on; without it the lines (and the golden files) stay as they were
        lines.append(f"    adapter slots per rank: {budget.adapter_slots} x rank {budget.adapter_rank}"
                     f" = {format_bytes(budget.adapter_bytes_per_rank)}")
    if budget.rank_memory_bytes is None:
        lines.append("    KV cache: set resources.accelerator.memory to plan it")
        return lines
    lines += [
        f"    memory per rank: {format_bytes(budget.rank_memory_bytes)}"
        + (f" (runtime reserve {format_bytes(budget.runtime_overhead_bytes)})" if budget.runtime_overhead_bytes else ""),
        f"    KV cache per rank: {format_bytes(budget.kv_cache_bytes_per_rank or 0)}"
        f" = {budget.kv_cache_tokens_per_replica} tokens per replica",
        f"    sequences of {budget.max_model_len} tokens that fit: {budget.sequences_at_max_model_len}",
    ]
    return lines


def describe(isvc: InferenceService, topology: Topology) -> str:
    """Roles, groups, ranks and memory budget, one role per paragraph."""
    name = isvc.metadata.name
    lines = [
        f"InferenceService {name}: {topology.mode.lower()}, runtime {isvc.spec.runtime.engine}, "
        f"model {topology.served_model_name} "
        f"from {topology.model.uri} (--model {topology.model.model_arg}, delivered by {topology.model.delivery})",
    ]
    if topology.adapters:
        lines.append("  adapters: " + ", ".join(f"{a.name} from {a.uri} ({a.path}, delivered by {a.delivery})"
                                             for a in topology.adapters))
    for role in topology.roles:
        groups = topology.groups_of(role)
        if not groups:
            lines.append(f"  {role}: 0 groups (scaled to zero)")
            continue
        first = groups[0]
        s = first.sharding
        lines.append(
            f"  {role}: {len(groups)} group(s) x {first.world_size} rank(s) "
            f"(tensor {s.tensor}, pipeline {s.pipeline}, expert {s.expert}), revision {first.revision}"
        )
        lines.append(f"    groups: {', '.join(g.name for g in groups)}")
        lines.append(f"    runs: {shlex.join(first.pod.argv)}")
        lines += _budget_lines(first.budget)
    lines.append(f"  router: {topology.router.replicas} replica(s), policy {topology.router.policy}")
    lines += [f"  warning: {w}" for w in topology.warnings]
    return "\n".join(lines)
