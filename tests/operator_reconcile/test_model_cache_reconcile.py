"""A reconcile with spec.model.cache applies the claim and the Job, and writes
status.modelCache from the Job it sees (a fake API, as test_reconcile_owner_check.py)."""

from __future__ import annotations

from typing import Any

import pytest

from frota.operator import reconcile as reconcile_module
from frota.operator.reconcile import Children, reconcile
from tests.operator_reconcile.conftest import sample
from tests.operator_reconcile.test_reconcile_owner_check import FakeApi


def owner(cache: bool = True) -> dict[str, Any]:
    body = sample("tiny", replicas=2)
    body["metadata"].update(uid="uid-1", generation=1, resourceVersion="5")
    body["spec"]["model"]["uri"] = "hf://org/repo"
    if cache:
        body["spec"]["model"]["cache"] = {"enabled": True, "size": "5Gi"}
    return body


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    monkeypatch.setattr(reconcile_module.kopf, "event", lambda *a, **k: None)
    return FakeApi(live_owner=None)


async def test_the_claim_and_the_job_are_applied_and_the_cache_is_pending(fake_api: FakeApi) -> None:
    body = owner()
    fake_api.live_owner = body
    outcome = await reconcile(body, Children(objects=(), pods=(), endpoint_slices=None), api=fake_api)
    assert "PersistentVolumeClaim/tiny-model-cache" in fake_api.applied
    [job] = [a for a in fake_api.applied if a.startswith("Job/")]
    assert outcome.status.modelCache.state == "Pending"
    assert outcome.status.modelCache.job == job.removeprefix("Job/")


async def test_a_failed_job_is_a_failed_cache_with_its_reason(fake_api: FakeApi) -> None:
    body = owner()
    fake_api.live_owner = body
    first = await reconcile(body, Children(objects=(), pods=(), endpoint_slices=None), api=fake_api)
    name = first.status.modelCache.job
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "uid": "j1"},
           "status": {"conditions": [{"type": "Failed", "status": "True",
                                      "reason": "BackoffLimitExceeded", "message": "limit"}]}}
    outcome = await reconcile(body, Children(objects=(job,), pods=(), endpoint_slices=None), api=fake_api)
    assert outcome.status.modelCache.state == "Failed"
    assert outcome.status.modelCache.reason == "BackoffLimitExceeded: limit"


async def test_a_running_job_is_downloading_with_the_fill_pods_last_progress(fake_api: FakeApi) -> None:
    body = owner()
    fake_api.live_owner = body
    first = await reconcile(body, Children(objects=(), pods=(), endpoint_slices=None), api=fake_api)
    name = first.status.modelCache.job
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "uid": "j1"},
           "status": {"active": 1}}
    outcome = await reconcile(body, Children(objects=(job,), pods=(), endpoint_slices=None), api=fake_api,
                              cache_progress={"bytes": 250, "totalBytes": 1000})
    cache = outcome.status.modelCache
    assert (cache.state, cache.bytes, cache.totalBytes, cache.percent) == ("Downloading", 250, 1000, 25)
    wire = outcome.status.to_wire()
    assert wire["modelCache"]["progress"] == "Downloading 25% (250 B)"
    assert wire["readyOfReplicas"] == "0/2"  # two replicas created, none ready yet


async def test_without_the_cache_there_is_no_model_cache_status(fake_api: FakeApi) -> None:
    body = owner(cache=False)
    fake_api.live_owner = body
    outcome = await reconcile(body, Children(objects=(), pods=(), endpoint_slices=None), api=fake_api)
    assert outcome.status.modelCache is None
    assert not [a for a in fake_api.applied if a.startswith(("Job/", "PersistentVolumeClaim/"))]
