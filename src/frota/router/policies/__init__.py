"""Routing policies: one class per policy behind `RoutingPolicy`, chosen by `PolicyName`."""

from __future__ import annotations

from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy
from frota.router.policies.least_load import LeastLoadPolicy, LoadSignal
from frota.router.policies.prefix_aware import PrefixAwareConfig, PrefixAwarePolicy
from frota.router.policies.round_robin import RoundRobinPolicy
from frota.router.policies.session import SessionPolicy

__all__ = [
    "Decision", "LeastLoadPolicy", "LoadSignal", "PolicyName", "PrefixAwareConfig",
    "PrefixAwarePolicy", "RoundRobinPolicy", "RouteRequest", "RoutingPolicy", "SessionPolicy",
    "make_policy",
]


def make_policy(
    name: PolicyName | str,
    *,
    load_signal: LoadSignal | str = LoadSignal.OUTSTANDING,
    prefix: PrefixAwareConfig | None = None,
    session_header: str = "x-session-id",
) -> RoutingPolicy:
    """Build the policy `name` with the options that concern it."""
    match PolicyName(name):
        case PolicyName.ROUND_ROBIN:
            return RoundRobinPolicy()
        case PolicyName.LEAST_LOAD:
            return LeastLoadPolicy(LoadSignal(load_signal))
        case PolicyName.PREFIX_AWARE:
            return PrefixAwarePolicy(prefix)
        case PolicyName.SESSION:
            return SessionPolicy(session_header)
