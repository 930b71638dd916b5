"""`kubectl get fisvc`'s Replicas column reads status.readyOfReplicas: ready of existing
replicas, so a fleet at zero reads 0/0 (and stays Ready with scaleToZero)."""

from __future__ import annotations

from frota.api import InferenceServiceStatus
from frota.api.crd import PRINTER_COLUMNS
from frota.operator.reports.observe import Observed
from frota.operator.reports.status import compute_status, parse_status
from tests.operator.reports.test_status import UP, group, intent


def column(name: str) -> dict:
    return next(c for c in PRINTER_COLUMNS if c["name"] == name)


def test_the_replicas_column_is_ready_of_existing_and_the_cache_column_its_progress() -> None:
    assert column("Replicas") | {"description": ""} == {
        "name": "Replicas", "type": "string", "jsonPath": ".status.readyOfReplicas", "description": ""}
    assert column("Cache")["jsonPath"] == ".status.modelCache.progress"


def test_at_zero_the_column_reads_0_of_0_and_ready_stays_true() -> None:
    status = compute_status(intent(units=0, scale_to_zero=True), Observed((), UP), old=None, now="T")
    wire = status.to_wire()
    assert (wire["replicas"], wire["readyReplicas"], wire["readyOfReplicas"]) == (0, 0, "0/0")
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("True", "ScaledToZero")


def test_coming_back_and_serving() -> None:
    starting = compute_status(intent(units=1), Observed((group(0, pods=()),), UP), old=None, now="T")
    assert starting.readyOfReplicas == f"{starting.readyReplicas}/{starting.replicas}"
    serving = compute_status(intent(units=2), Observed((group(0), group(1)), UP), old=None, now="T")
    assert serving.readyOfReplicas == "2/2"


def test_the_text_follows_the_counts_even_when_a_stale_one_is_read_back() -> None:
    old = parse_status({"replicas": 3, "readyReplicas": 1, "readyOfReplicas": "9/9"})
    assert old.readyOfReplicas == "1/3"
    assert InferenceServiceStatus().readyOfReplicas == "0/0"
