"""Manifest in, child objects out: what `frota render` prints and the operator applies.

Every child but one: the fleet key's Secret, which the operator alone creates on the
cluster (its key is random and made there; `frota.operator.loop.fleet_key`), is never rendered,
so no key is ever printed, and applying a render cannot leave a fleet with a keyless one."""

from __future__ import annotations

from typing import Any

from frota.api import Capacity, InferenceService, InferenceServiceStatus
from frota.api.contract import Label
from frota.operator.builders import build_children, service_url
from frota.plan.planner import plan
from frota.plan.topology import Topology
from frota.plan.validation import SpecError


def render(isvc: InferenceService) -> tuple[Topology, list[dict[str, Any]]]:
    """Plan an InferenceService and build its children."""
    try:
        topology = plan(isvc)
    except SpecError as exc:
        raise exc.about(f"InferenceService {isvc.metadata.name}") from None
    return topology, build_children(isvc, topology)


def serving_selector(isvc: InferenceService, topology: Topology) -> str:
    """Pods that serve requests (rank 0 of each worker or decode group): the scale subresource's selector."""
    return (f"{Label.NAME}=frota,{Label.INSTANCE}={isvc.metadata.name},"
            f"{Label.ROLE}={topology.serving_role},{Label.POD_INDEX}=0")


def planned_status(isvc: InferenceService, topology: Topology) -> InferenceServiceStatus:
    """The status fields that follow from the plan alone (selector, url, mode, revision, capacity)."""
    serving = topology.groups_of(topology.serving_role)
    budget = topology.serving_budget
    capacity = None
    if budget is not None:
        has_kv = budget.kv_cache_tokens_per_replica is not None
        capacity = Capacity(
            weightBytesPerRank=budget.weight_bytes_per_rank,
            maxModelLen=budget.max_model_len,
            kvCacheTokensPerReplica=budget.kv_cache_tokens_per_replica,
            sequencesAtMaxModelLen=budget.sequences_at_max_model_len if has_kv else None,
        )
    return InferenceServiceStatus(
        selector=serving_selector(isvc, topology),
        url=service_url(isvc),
        mode=topology.mode,
        revision=serving[0].revision if serving else None,
        capacity=capacity,
    )
