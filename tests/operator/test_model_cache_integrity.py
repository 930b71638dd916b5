"""spec.model.sha256 and the cache's checks, from the operator's side: the field is
validated the same by the apiserver (CRD schema and CEL) and pydantic; the Job and every
pod's wait get the pin; a pin is part of the cache key; a worker pod whose check failed
makes status.modelCache Failed with the file and both digests, until a check passes."""

from __future__ import annotations

import json

import pytest

from frota.api.contract import CacheJob
from frota.api.crd import openapi_schema
from frota.operator.builders import build_children
from frota.operator.builders.model_cache import WAIT_CONTAINER
from frota.operator.reports.model_cache_status import model_cache_status
from frota.plan.planner import plan
from frota.plan.validation import SpecError, load
from tests.api.apiserver_sim import admit
from tests.isvc_fixtures import Spec

PIN = "5d" * 32
GGUF_URI = "https://models.example/m.gguf"


def cached(uri: str = GGUF_URI, sha256: str | None = PIN) -> Spec:
    spec = Spec().replicas(2).set("spec.model.uri", uri).set("spec.model.cache", {"enabled": True})
    return spec.set("spec.model.sha256", sha256) if sha256 else spec


def objects(spec: Spec) -> list[dict]:
    isvc = spec.build()
    return build_children(isvc, plan(isvc))


def job_and_waits(spec: Spec) -> tuple[dict, list[dict]]:
    objs = objects(spec)
    [job] = [o for o in objs if o["kind"] == "Job"]
    waits = [c for o in objs if o["kind"] == "StatefulSet"
             for c in o["spec"]["template"]["spec"]["initContainers"] if c["name"] == WAIT_CONTAINER]
    return job, waits


# --- the field ----------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["hf://org/repo", GGUF_URI, "https://models.example/m/", f"{GGUF_URI}#sha256={PIN}"])
def test_a_sha256_on_a_download_is_admitted_by_the_apiserver_and_pydantic(uri: str) -> None:
    obj = cached(uri).obj
    _, errors = admit(openapi_schema(), obj)
    assert errors == []
    assert load(obj).spec.model.sha256 == PIN


@pytest.mark.parametrize(("uri", "sha256", "says"), [
    (GGUF_URI, PIN.upper(), "^[0-9a-f]{64}$"),
    (GGUF_URI, PIN[:-1], "^[0-9a-f]{64}$"),
    (GGUF_URI, "g" * 64, "^[0-9a-f]{64}$"),
    ("alias:smollm2", PIN, "needs an hf:// or https:// uri"),
    ("pvc://claim/m", PIN, "needs an hf:// or https:// uri"),
    ("synthetic:dense-tiny", PIN, "needs an hf:// or https:// uri"),
    (f"{GGUF_URI}#sha256={'a' * 64}", PIN, "name different digests"),
], ids=["uppercase", "short", "not-hex", "alias", "pvc", "synthetic", "fragment-disagrees"])
def test_a_bad_sha256_is_refused_by_the_apiserver_and_pydantic_alike(uri: str, sha256: str, says: str) -> None:
    obj = Spec().set("spec.model.uri", uri).set("spec.model.sha256", sha256).obj
    _, errors = admit(openapi_schema(), obj)
    assert any(says in e for e in errors), errors
    with pytest.raises(SpecError):
        load(obj)


# --- the Job and the pods' wait -----------------------------------------------------------


def test_the_pin_goes_to_the_job_and_to_every_pods_check() -> None:
    job, waits = job_and_waits(cached())
    [fill] = job["spec"]["template"]["spec"]["containers"]
    assert fill["args"][fill["args"].index("--sha256") + 1] == PIN
    assert len(waits) == 2
    for wait in waits:
        assert wait["args"][-2:] == ["--sha256", PIN]
        # the mismatch is the termination message the status reads
        assert wait["terminationMessagePolicy"] == "FallbackToLogsOnError"
    unpinned_job, unpinned_waits = job_and_waits(cached(sha256=None))
    assert "--sha256" not in unpinned_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all("--sha256" not in w["args"] for w in unpinned_waits)


def test_a_new_pin_is_a_new_cache_directory_filled_by_a_new_job() -> None:
    names = {job_and_waits(cached(sha256=pin))[0]["metadata"]["name"] for pin in (None, PIN, "77" * 32)}
    assert len(names) == 3
    key = job_and_waits(cached())[0]["metadata"]["name"].rsplit("-", 1)[-1]
    assert all(w["args"][2] == f"/model-cache/{key}" for w in job_and_waits(cached())[1])


# --- status: a pod whose check failed -----------------------------------------------------

COMPLETE = {"metadata": {"name": "j", "uid": "u1"},
            "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
MISMATCH = ("frota cache wait: /model-cache/k/m.gguf: sha256 " + "1" * 64 + " (10 bytes) on disk, but the "
            "cache's manifest recorded " + "2" * 64 + " (10 bytes) at the download: the file changed since")


def worker(name: str, state: dict, last: dict | None = None) -> dict:
    status = {"name": WAIT_CONTAINER, "state": state}
    if last is not None:
        status["lastState"] = last
    return {"metadata": {"name": name, "ownerReferences": [{"uid": "sts"}]},
            "status": {"initContainerStatuses": [status]}}


def failed() -> dict:
    return {"terminated": {"exitCode": CacheJob.EXIT_PERMANENT, "message": MISMATCH + "\n"}}


@pytest.mark.parametrize("pod", [
    worker("tiny-0-0", failed()),  # just ended
    worker("tiny-0-0", {"waiting": {"reason": "CrashLoopBackOff"}}, failed()),  # backing off
    worker("tiny-0-0", {"running": {}}, failed()),  # checking again
], ids=["terminated", "backoff", "rechecking"])
def test_a_pod_whose_cache_check_failed_makes_the_cache_failed_naming_the_file_and_both_digests(pod: dict) -> None:
    status = model_cache_status(COMPLETE, "j", [worker("tiny-1-0", {"running": {}}), pod])
    assert status.state == "Failed" and status.job == "j"
    assert "tiny-0-0" in status.reason and "/model-cache/k/m.gguf" in status.reason
    assert "1" * 64 in status.reason and "2" * 64 in status.reason


def test_a_check_that_passes_again_or_a_wait_that_timed_out_is_no_failed_check() -> None:
    passed = worker("tiny-0-0", {"terminated": {"exitCode": 0, "message": ""}}, failed())
    timed_out = worker("tiny-1-0", {"terminated": {"exitCode": 1, "message": "no .frota-cache.json"}})
    status = model_cache_status(COMPLETE, "j", [passed, timed_out, {"metadata": {}, "status": {}}])
    assert status.state == "Ready" and status.reason is None


def test_a_running_job_is_reported_before_an_old_pods_failed_check() -> None:
    # The user deleted the Job to refill the cache: its progress is the news.
    running = {"metadata": {"name": "j", "uid": "u2"}, "status": {"active": 1}}
    assert model_cache_status(running, "j", [worker("tiny-0-0", failed())]).state == "Downloading"


def test_the_reason_fits_the_status_field() -> None:
    long = {"terminated": {"exitCode": CacheJob.EXIT_PERMANENT, "message": json.dumps("x" * 5000)}}
    assert len(model_cache_status(COMPLETE, "j", [worker("p", long)]).reason) <= 1024
