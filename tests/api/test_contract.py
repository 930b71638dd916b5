"""The contract's typed event reasons cover every condition transition."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from frota.api.contract import ConditionType, EventReason, condition_event_reason
from frota.api.status import Condition

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
