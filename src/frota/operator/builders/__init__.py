"""Pure builders: an InferenceService and its Topology in, child objects (plain dicts) out."""

from __future__ import annotations

import copy
from typing import Any

from frota.api import InferenceService
from frota.operator.builders.policies import policy_children
from frota.operator.builders.router import router_children, service_url
from frota.operator.builders.workers import worker_children
from frota.plan.topology import Topology

__all__ = ["build_children", "service_url"]


def build_children(isvc: InferenceService, topology: Topology) -> list[dict[str, Any]]:
    """Every child object, in apply order (config and RBAC before the pods that use them)."""
    children = [*worker_children(isvc, topology), *router_children(isvc, topology),
                *policy_children(isvc, topology)]
    # Each object owns its dicts, so a caller may patch one without touching another.
    return copy.deepcopy(children)
