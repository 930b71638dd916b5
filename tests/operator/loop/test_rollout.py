"""The rollout planner: which groups move next, and availability never dips below the floor."""

from __future__ import annotations

import pytest

from frota.operator.loop.rollout import GroupState, RolloutPlan, plan_rollout, resolve_bound

OLD, NEW = "old", "new"


def plan(replicas: int, groups: dict[int, tuple[str, bool]], *, unavailable: int = 0,
         surge: int = 1) -> RolloutPlan:
    return plan_rollout(
        replicas=replicas, target=NEW,
        groups={i: GroupState(rev, serving) for i, (rev, serving) in groups.items()},
        max_unavailable=unavailable, max_surge=surge,
    )


def test_fresh_fleet_creates_every_group() -> None:
    p = plan(3, {})
    assert p.apply == (0, 1, 2) and not p.replace and not p.delete and p.is_complete


def test_steady_state_changes_nothing() -> None:
    p = plan(2, {0: (NEW, True), 1: (NEW, True)})
    assert p.apply == (0, 1) and not p.replace and not p.hold and not p.delete


def test_max_unavailable_one_replaces_one_group_at_a_time_in_order() -> None:
    p = plan(3, {0: (OLD, True), 1: (OLD, True), 2: (OLD, True)}, unavailable=1, surge=0)
    assert p.replace == (0,) and p.hold == (1, 2)
    # Group 0 restarting (new revision, not serving): nothing else may go down.
    p = plan(3, {0: (NEW, False), 1: (OLD, True), 2: (OLD, True)}, unavailable=1, surge=0)
    assert p.replace == () and p.hold == (1, 2)
    p = plan(3, {0: (NEW, True), 1: (OLD, True), 2: (OLD, True)}, unavailable=1, surge=0)
    assert p.replace == (1,) and p.hold == (2,)


def test_surge_starts_a_new_group_before_taking_any_old_one_down() -> None:
    p = plan(2, {0: (OLD, True), 1: (OLD, True)}, unavailable=0, surge=1)
    assert p.surge == (2,) and 2 in p.apply and p.replace == () and p.hold == (0, 1)
    p = plan(2, {0: (OLD, True), 1: (OLD, True), 2: (NEW, True)}, unavailable=0, surge=1)
    assert p.replace == (0,) and p.hold == (1,)


def test_surge_group_goes_only_once_every_current_group_serves() -> None:
    p = plan(2, {0: (NEW, True), 1: (NEW, False), 2: (NEW, True)}, surge=1)
    assert p.delete == () and p.surge == (2,)
    p = plan(2, {0: (NEW, True), 1: (NEW, True), 2: (NEW, True)}, surge=1)
    assert p.delete == (2,) and p.is_complete


def test_groups_that_do_not_serve_are_replaced_without_spending_budget() -> None:
    p = plan(3, {0: (OLD, False), 1: (OLD, True), 2: (OLD, True)}, unavailable=0, surge=0)
    # 0/0 is not allowed by the API; the planner still moves with one unavailable.
    assert p.replace[0] == 0


def test_scale_down_removes_the_highest_groups() -> None:
    p = plan(1, {0: (NEW, True), 1: (NEW, True), 2: (NEW, True)})
    assert p.apply == (0,) and p.delete == (1, 2)


def test_scale_to_zero_removes_every_group() -> None:
    p = plan(0, {0: (NEW, True), 1: (OLD, False)})
    assert p.apply == () and set(p.delete) == {0, 1}


def test_scale_up_during_a_rollout_creates_new_groups_at_the_new_revision() -> None:
    p = plan(3, {0: (OLD, True)}, unavailable=1, surge=0)
    assert {1, 2} <= set(p.apply)
    assert p.hold == () or p.hold == (0,)


@pytest.mark.parametrize(
    ("value", "replicas", "round_up", "expected"),
    [(None, 4, False, 7), (2, 4, False, 2), ("25%", 4, False, 1), ("30%", 4, False, 1),
     ("30%", 4, True, 2), ("0%", 4, True, 0), ("3", 4, True, 3)],
)
def test_bounds_resolve_like_deployments(value, replicas, round_up, expected) -> None:
    assert resolve_bound(value, replicas, round_up=round_up, default=7) == expected


def test_availability_floor_holds_through_a_whole_simulated_rollout() -> None:
    replicas, unavailable = 5, 2
    groups = {i: (OLD, True) for i in range(replicas)}
    for _ in range(20):
        p = plan(replicas, groups, unavailable=unavailable, surge=0)
        for i in p.replace:
            groups[i] = (NEW, False)
        serving = sum(1 for rev, ok in groups.values() if ok)
        assert serving >= replicas - unavailable
        # The restarted groups come up before the next step.
        groups = {i: (rev, True) for i, (rev, _) in groups.items()}
        if all(rev == NEW for rev, _ in groups.values()):
            break
    assert all(rev == NEW for rev, _ in groups.values())
