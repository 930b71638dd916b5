"""`round-robin`: each request to the next healthy worker."""

from __future__ import annotations

from collections.abc import Sequence

from frota.router.health import Worker
from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy


class RoundRobinPolicy(RoutingPolicy):
    """Cycle through the candidates; the simplest fair spread, blind to load and prefixes."""

    name = PolicyName.ROUND_ROBIN

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        worker = candidates[self._next % len(candidates)]
        self._next += 1
        return Decision(worker, "next")
