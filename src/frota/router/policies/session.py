"""`session`: requests of one session stick to one worker."""

from __future__ import annotations

from collections.abc import Sequence

from frota.router.health import Worker
from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy
from frota.router.policies.ring import RingCache, stable_hash


class SessionPolicy(RoutingPolicy):
    """Affinity by session key: the `session_header` header (default `x-session-id`)
    or else the body's `user` field, mapped to a worker by consistent hashing.

    A session keeps its worker (and so its KV cache) while that worker is
    healthy; when it leaves, only its sessions move. Requests without a key go
    to the worker with the fewest outstanding requests.
    """

    name = PolicyName.SESSION
    needs_body = True

    def __init__(self, session_header: str = "x-session-id") -> None:
        self.session_header = session_header.lower()
        self._ring = RingCache()

    def session_key(self, request: RouteRequest) -> str | None:
        key = request.headers.get(self.session_header)
        if key:
            return key
        user = request.json.get("user")
        return str(user) if user not in (None, "") else None

    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        key = self.session_key(request)
        if key is None:
            worker = min(candidates, key=lambda w: w.num_outstanding)
            return Decision(worker, "no_session")
        worker = next(self._ring.walk(stable_hash(key.encode()), candidates))
        return Decision(worker, "affinity")
