"""status.adapters from what the serving workers list in /v1/models (pure)."""

from __future__ import annotations

from frota.api import AdapterStatus
from frota.operator.loop.state import OperatorState
from frota.operator.reports.adapter_report import models_url
from frota.operator.reports.adapter_status import adapter_statuses, listed_adapters

KEY = ("default", "tiny")


def models(*adapters: tuple[str, str]) -> dict:
    """A /v1/models body as the server writes it: the base model, then each adapter."""
    base = {"id": "smollm2", "object": "model", "owned_by": "frota"}
    return {"object": "list", "data": [base, *({"id": n, "object": "model", "owned_by": "frota",
                                                 "parent": "smollm2", "root": p} for n, p in adapters)]}


def test_the_adapters_are_the_entries_with_a_parent():
    assert listed_adapters(models(("sql", "/a/sql"), ("tone", "/a/tone"))) == {"sql": "/a/sql", "tone": "/a/tone"}
    assert listed_adapters(models()) == {}


def test_a_body_that_is_no_model_list_is_no_report():
    assert listed_adapters({"error": {"message": "nope"}}) is None
    assert listed_adapters(["not", "a", "dict"]) is None


def test_the_models_url_sits_beside_the_metrics_url():
    assert models_url("http://10.0.0.5:8000/metrics") == "http://10.0.0.5:8000/v1/models"


def test_spec_adapters_count_the_replicas_that_list_them_and_say_where_they_are_missing():
    lists = [{"sql": "/a/sql", "tone": "/a/tone"}, {"sql": "/a/sql"}]
    out = adapter_statuses(("sql", "tone"), lists, [])
    assert out[0] == AdapterStatus(name="sql", source="spec", residentReplicas=2)
    assert out[1].residentReplicas == 1
    assert out[1].lastError.startswith("not loaded on 1 of 2 serving replicas")


def test_adapters_loaded_at_run_time_are_recorded_with_their_path_after_the_spec_ones():
    lists = [{"sql": "/a/sql", "zeta": "/tmp/zeta", "alpha": "/tmp/alpha"}, {"sql": "/a/sql", "zeta": "/tmp/zeta"}]
    out = adapter_statuses(("sql",), lists, [])
    assert [(a.name, a.source, a.path, a.residentReplicas) for a in out] == [
        ("sql", "spec", None, 2), ("alpha", "runtime", "/tmp/alpha", 1), ("zeta", "runtime", "/tmp/zeta", 2)]


def test_a_runtime_adapter_no_answering_replica_lists_was_unloaded():
    old = [AdapterStatus(name="zeta", source="runtime", path="/tmp/zeta", residentReplicas=2)]
    assert adapter_statuses((), [{}, {}], old) == []


def test_with_no_replica_serving_the_runtime_adapters_stay_known():
    old = [AdapterStatus(name="sql", source="spec", residentReplicas=2),
           AdapterStatus(name="zeta", source="runtime", path="/tmp/zeta", residentReplicas=2)]
    out = adapter_statuses(("sql",), [], old)
    assert out == [AdapterStatus(name="sql", source="spec", residentReplicas=0),
                   AdapterStatus(name="zeta", source="runtime", path="/tmp/zeta", residentReplicas=0)]


def test_before_the_first_read_status_stands_and_follows_the_spec():
    old = [AdapterStatus(name="sql", source="spec", residentReplicas=2),
           AdapterStatus(name="gone", source="spec", residentReplicas=2),
           AdapterStatus(name="zeta", source="runtime", path="/tmp/zeta", residentReplicas=1)]
    out = adapter_statuses(("sql", "new"), None, old)
    assert [(a.name, a.source, a.residentReplicas) for a in out] == [
        ("sql", "spec", 2), ("new", "spec", 0), ("zeta", "runtime", 1)]


def test_a_runtime_adapter_added_to_the_spec_becomes_a_spec_adapter():
    out = adapter_statuses(("zeta",), [{"zeta": "/tmp/zeta"}], [])
    assert out[0].source == "spec" and out[0].residentReplicas == 1


def test_the_state_keeps_a_report_and_says_when_it_is_news():
    state = OperatorState()
    assert state.report_adapters(KEY, ({"a": "/a"}, {"b": "/b"}))
    assert not state.report_adapters(KEY, ({"b": "/b"}, {"a": "/a"}))  # replica order is no news
    assert state.report_adapters(KEY, ({"a": "/a"},))
    state.forget(KEY)
    assert KEY not in state.reported_adapters
