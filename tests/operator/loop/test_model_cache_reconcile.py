"""A reconcile with spec.model.cache applies the claim and the Job, and writes
status.modelCache from the Job it sees (a fake API, as test_reconcile_owner_check.py)."""

from __future__ import annotations

from typing import Any

import pytest

from frota.operator.loop import reconcile as reconcile_module
from frota.operator.loop.children import Children
from frota.operator.loop.reconcile import reconcile
from tests.operator.conftest import sample
from tests.operator.loop.test_reconcile_owner_check import FakeApi


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


async def cache_job(fake_api: FakeApi, status: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An InferenceService reconciled once, and the model-cache Job that reconcile made, in `status`."""
    body = owner()
    fake_api.live_owner = body
    first = await reconcile(body, Children(objects=(), pods=(), endpoint_slices=None), api=fake_api)
    name = first.status.modelCache.job
    return body, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "uid": "j1"},
                  "status": status}


async def test_a_failed_job_is_a_failed_cache_with_its_reason(fake_api: FakeApi) -> None:
    body, job = await cache_job(fake_api, {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}]})
    outcome = await reconcile(body, Children(objects=(job,), pods=(), endpoint_slices=None), api=fake_api)
    assert outcome.status.modelCache.state == "Failed"
    assert outcome.status.modelCache.reason == "BackoffLimitExceeded: limit"


def fill_pod(job: dict[str, Any], exit_code: int, message: str) -> dict[str, Any]:
    """The Job's pod, its fill container ended, as the operator's pod index caches it."""
    import kopf

    from frota.api.contract import Label
    from frota.operator.loop.handlers import index_pod

    labels = {Label.INSTANCE: "tiny", "app.kubernetes.io/component": "model-cache"}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "fill-1", "namespace": "default", "labels": labels,
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "ownerReferences": [{"kind": "Job", "name": job["metadata"]["name"],
                                             "uid": job["metadata"]["uid"]}]},
           "status": {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
               {"name": "fill", "restartCount": 0, "state": {"terminated": {
                   "exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                   "message": message}}}]}}
    [(_, slim)] = index_pod(kopf.Body(pod), namespace="default", labels=labels).items()
    return slim


async def test_the_fill_pods_error_reaches_the_reason_through_the_pod_index(fake_api: FakeApi) -> None:
    """The Job's own Failed condition names only its rule; the fill pod's last log line (its
    termination message) says what went wrong, and the operator sees it in its slim pod cache."""
    body, job = await cache_job(fake_api, {"conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
         "message": "Container fill failed with exit code 3"}]})
    error = "FetchError: sha256 mismatch: expected 000, got abc"
    pod = fill_pod(job, 3, f"downloading...\n{error}\n")
    outcome = await reconcile(body, Children(objects=(job,), pods=(pod,), endpoint_slices=None),
                              api=fake_api)
    assert outcome.status.modelCache.reason == \
        f"PodFailurePolicy: Container fill failed with exit code 3: downloading... {error}"
    # and a succeeded fill's {"bytes": N} is the cache's size
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    pod = fill_pod(job, 0, '{"bytes": 1234}')
    outcome = await reconcile(body, Children(objects=(job,), pods=(pod,), endpoint_slices=None),
                              api=fake_api)
    assert (outcome.status.modelCache.state, outcome.status.modelCache.bytes) == ("Ready", 1234)


async def test_a_running_job_is_downloading_with_the_fill_pods_last_progress(fake_api: FakeApi) -> None:
    body, job = await cache_job(fake_api, {"active": 1})
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


def test_a_check_waiting_to_restart_keeps_its_failure_in_the_pod_index() -> None:
    """In CrashLoopBackOff the kubelet shows why the cache check ended only in lastState:
    the operator's slim pod cache keeps it, so status.modelCache can name the file."""
    import kopf

    from frota.api.contract import Label
    from frota.operator.builders.model_cache import WAIT_CONTAINER
    from frota.operator.loop.handlers import index_pod

    labels = {Label.INSTANCE: "tiny", Label.ROLE: "worker"}
    message = "model.gguf: sha256 is 00ff, the manifest says abcd"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "tiny-0-0", "namespace": "default", "labels": labels},
           "status": {"phase": "Pending", "initContainerStatuses": [{
               "name": WAIT_CONTAINER, "restartCount": 2,
               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
               "lastState": {"terminated": {"exitCode": 3, "message": message}}}]}}
    [(_, slim)] = index_pod(kopf.Body(pod), namespace="default", labels=labels).items()
    (status,) = slim["status"]["initContainerStatuses"]
    assert status["lastState"] == {"terminated": {"exitCode": 3, "message": message}}
