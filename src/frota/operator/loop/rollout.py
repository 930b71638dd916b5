"""Which replica groups to create, update, restart or delete next (pure).

A replica group is one StatefulSet: all ranks of one model replica. A group
is updated as a whole (its template is replaced and all its pods deleted
together), so it never serves with ranks of mixed revisions. The plan keeps
at least `replicas - maxUnavailable` groups serving, and may run up to
`maxSurge` extra groups of the new revision while old ones are replaced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupState:
    """What the operator observed about one existing group."""

    revision: str
    serving: bool


@dataclass(frozen=True)
class RolloutPlan:
    """The actions for one role, by group index.

    `apply` groups get the target revision (created, or kept converged);
    `replace` is the subset of `apply` that exists at an older revision and
    must have all its pods deleted after its template is replaced; `hold`
    groups keep their old revision for now; `delete` groups are removed.
    """

    apply: tuple[int, ...] = ()
    replace: tuple[int, ...] = ()
    hold: tuple[int, ...] = ()
    delete: tuple[int, ...] = ()
    surge: tuple[int, ...] = field(default=())

    @property
    def is_complete(self) -> bool:
        """True when nothing is held back or surged (the role is fully at the target)."""
        return not self.hold and not self.replace and not self.surge


def resolve_bound(value: int | str | None, replicas: int, *, round_up: bool, default: int) -> int:
    """Resolve an int-or-percent rollout bound against `replicas`.

    Percentages round up for maxSurge and down for maxUnavailable, as
    Deployments do.
    """
    if value is None:
        return default
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100.0 * replicas
            return int(math.ceil(fraction) if round_up else math.floor(fraction))
        return int(text)
    return int(value)


def plan_rollout(
    *,
    replicas: int,
    target: str,
    groups: Mapping[int, GroupState],
    max_unavailable: int,
    max_surge: int,
) -> RolloutPlan:
    """Plan one step of a rollout for one role.

    `groups` maps the index of every existing group to its state. Indexes
    below `replicas` are the role's groups; indexes from `replicas` up are
    surge groups (or groups left over from a scale-down).
    """
    if max_unavailable <= 0 and max_surge <= 0:
        max_unavailable = 1  # a rollout must be able to move; the API rejects 0/0 anyway
    outdated = sorted(i for i, g in groups.items() if i < replicas and g.revision != target)
    extra = sorted(i for i in groups if i >= replicas)
    if not outdated:
        current = tuple(range(replicas))
        settled = all(i in groups and groups[i].serving for i in current)
        # A serving extra group (a surge group, or one being scaled away) is
        # removed only once every current group serves, so the last step of a
        # rollout or a scale-down never dips below the availability floor.
        keep = () if settled else tuple(i for i in extra if groups[i].serving)
        return RolloutPlan(
            apply=current, delete=tuple(i for i in extra if i not in keep), surge=keep
        )

    surge_count = min(max(max_surge, 0), len(outdated))
    surge = tuple(range(replicas, replicas + surge_count))
    leftovers = tuple(i for i in extra if i not in surge)
    serving = sum(
        1 for i, g in groups.items() if g.serving and (i < replicas or i in surge)
    )
    min_serving = max(replicas - max(max_unavailable, 0), 0)
    budget = serving - min_serving

    replace: list[int] = []
    hold: list[int] = []
    for i in outdated:
        if not groups[i].serving:
            replace.append(i)  # not serving anyway: replacing it costs no availability
        elif budget > 0:
            replace.append(i)
            budget -= 1
        else:
            hold.append(i)
    apply = tuple(i for i in range(replicas) if i not in hold) + surge
    return RolloutPlan(
        apply=apply, replace=tuple(replace), hold=tuple(hold), delete=leftovers, surge=surge
    )
