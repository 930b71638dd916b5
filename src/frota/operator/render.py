"""Manifest in, child objects out: what `frota render` prints and the operator applies."""

from __future__ import annotations

from typing import Any

from frota.api import KIND, Capacity, InferenceService, InferenceServiceStatus
from frota.api.contract import Label
from frota.operator.builders import build_children, service_url
from frota.operator.planner import plan
from frota.operator.topology import Topology
from frota.operator.validation import SpecError, load


def inference_services(documents: list[dict[str, Any]], namespace: str | None = None) -> list[InferenceService]:
    """The InferenceServices among YAML documents (others are skipped), validated."""
    out = []
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            continue
        if namespace and not doc.get("metadata", {}).get("namespace"):
            doc = {**doc, "metadata": {**doc.get("metadata", {}), "namespace": namespace}}
        try:
            out.append(load(doc))
        except SpecError as exc:
            name = (doc.get("metadata") or {}).get("name", "?")
            raise exc.about(f"InferenceService {name}") from None
    return out


def render(isvc: InferenceService) -> tuple[Topology, list[dict[str, Any]]]:
    """Plan an InferenceService and build its children."""
    try:
        topology = plan(isvc)
    except SpecError as exc:
        raise exc.about(f"InferenceService {isvc.metadata.name}") from None
    return topology, build_children(isvc, topology)


def serving_selector(isvc: InferenceService, topology: Topology) -> str:
    """Pods that serve requests (rank 0 of each worker or decode group): the scale subresource's selector."""
    role = "decode" if topology.mode == "Disaggregated" else "worker"
    return f"{Label.NAME}=frota,{Label.INSTANCE}={isvc.metadata.name},{Label.ROLE}={role},{Label.POD_INDEX}=0"


def planned_status(isvc: InferenceService, topology: Topology) -> InferenceServiceStatus:
    """The status fields that follow from the plan alone (selector, url, mode, revision, capacity)."""
    serving = [g for g in topology.groups if g.role in ("worker", "decode")]
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
