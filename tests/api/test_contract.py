"""The contract's typed event reasons cover every condition transition; one role type."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest
from pydantic import ValidationError

from frota.api.contract import (
    WORKER_ROLES,
    ConditionType,
    EventReason,
    Role,
    condition_event_reason,
)
from frota.api.status import Condition, RoleStatus

STATUSES = get_args(Condition.model_fields["status"].annotation)


@pytest.mark.parametrize(("type_", "status"), list(itertools.product(ConditionType, STATUSES)))
def test_each_condition_transition_has_an_event_reason(type_: ConditionType, status: str) -> None:
    reason = condition_event_reason(type_, status)
    assert isinstance(reason, EventReason)
    assert reason == f"{type_}{status}"  # the strings `kubectl get events` has always shown


def test_a_transition_reason_reads_the_condition_type() -> None:
    assert condition_event_reason("Ready", "True") is EventReason.READY_TRUE
    with pytest.raises(ValueError):
        condition_event_reason("Bogus", "True")


def test_a_role_status_names_a_worker_role_of_the_contract() -> None:
    assert WORKER_ROLES == (Role.WORKER, Role.PREFILL, Role.DECODE)
    status = RoleStatus(role="decode")
    assert status.role is Role.DECODE
    assert status.to_wire()["role"] == "decode"
    with pytest.raises(ValidationError):
        RoleStatus(role=Role.ROUTER)  # the router has no replica groups
