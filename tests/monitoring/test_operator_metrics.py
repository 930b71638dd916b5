"""The operator metrics the alerts read: a fleet's readiness, and counters that exist at zero."""

from __future__ import annotations

from typing import Any

import pytest

from frota.api import InferenceServiceStatus
from frota.operator.loop import converge
from frota.operator.loop.reconcile import Outcome
from frota.operator.loop.state import OperatorState
from frota.operator.metrics import OperatorMetrics
from frota.operator.settings import OperatorSettings

BODY = {"metadata": {"name": "tiny", "namespace": "team-a"}}
KEY = ("team-a", "tiny")


def sample(metrics: OperatorMetrics, metric: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(metric, labels)


def status(ready: str) -> InferenceServiceStatus:
    return InferenceServiceStatus.model_validate({"conditions": [{
        "type": "Ready", "status": ready, "reason": "AllReplicasReady", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]})


def test_error_and_failure_counters_exist_at_zero_before_the_first_one() -> None:
    metrics = OperatorMetrics()
    assert sample(metrics, "frota_operator_reconciles_total", result="error") == 0
    assert sample(metrics, "frota_operator_group_restarts_total", cause="failure") == 0


async def test_ready_gauge_follows_the_ready_condition_and_goes_with_the_object(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = OperatorState(OperatorSettings())
    written: list[InferenceServiceStatus] = [status("False"), status("True")]

    async def fake_reconcile(*_: Any, **__: Any) -> Outcome:
        return Outcome(result="converged", status=written.pop(0))

    monkeypatch.setattr(converge, "reconcile", fake_reconcile)
    ready = "frota_operator_inferenceservice_ready"
    await converge.reconcile_once(BODY, state)
    assert sample(state.metrics, ready, namespace="team-a", name="tiny") == 0
    await converge.reconcile_once(BODY, state)
    assert sample(state.metrics, ready, namespace="team-a", name="tiny") == 1
    state.forget(KEY)
    assert sample(state.metrics, ready, namespace="team-a", name="tiny") is None
    state.forget(KEY)  # a second delete (or one never reconciled) is no error
