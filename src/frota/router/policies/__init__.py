"""Routing policies: one class per policy behind `RoutingPolicy`, chosen by `PolicyName`."""

from __future__ import annotations

from frota.router.policies.base import Decision, PolicyName, RouteRequest, RoutingPolicy
from frota.router.policies.least_load import LeastLoadPolicy, LoadSignal
from frota.router.policies.prefix_aware import PrefixAwarePolicy
from frota.router.policies.round_robin import RoundRobinPolicy
from frota.router.policies.session import SessionPolicy

__all__ = [
    "Decision", "LeastLoadPolicy", "LoadSignal", "PolicyName", "PrefixAwarePolicy",
    "RoundRobinPolicy", "RouteRequest", "RoutingPolicy", "SessionPolicy", "make_policy",
]


def make_policy(
    name: PolicyName | str,
    *,
    load_signal: LoadSignal | str = LoadSignal.OUTSTANDING,
    prefix_block_chars: int = 128,
    prefix_max_blocks: int = 64,
    prefix_balance: float = 0.25,
    prefix_balance_abs: int = 8,
    prefix_hot_window: int = 64,
    prefix_min_match: float = 0.5,
    session_header: str = "x-session-id",
) -> RoutingPolicy:
    """Build the policy `name` with the options that concern it."""
    match PolicyName(name):
        case PolicyName.ROUND_ROBIN:
            return RoundRobinPolicy()
        case PolicyName.LEAST_LOAD:
            return LeastLoadPolicy(LoadSignal(load_signal))
        case PolicyName.PREFIX_AWARE:
            return PrefixAwarePolicy(prefix_block_chars, prefix_max_blocks, prefix_balance,
                                     prefix_min_match, balance_abs=prefix_balance_abs,
                                     hot_window=prefix_hot_window)
        case PolicyName.SESSION:
            return SessionPolicy(session_header)
