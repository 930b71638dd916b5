"""spec.model.cache: one claim and one Job per InferenceService fill the weights once;
worker pods mount the claim read-only and only wait; status.modelCache from the Job."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from frota.api.contract import CacheJob
from frota.operator.builders import build_children
from frota.operator.builders.model_cache import CACHE_DIR, MARKER_WAIT_ARGS, PROGRESS_PORT
from frota.operator.reports.model_cache_status import model_cache_status
from frota.plan.planner import plan
from tests.isvc_fixtures import Spec

URI = "hf://org/repo"


def cached(uri: str = URI, **cache) -> Spec:
    return (Spec().replicas(2).set("spec.model.uri", uri)
            .set("spec.model.cache", {"enabled": True, **cache}))


def children(spec: Spec) -> list[dict]:
    isvc = spec.build()
    return build_children(isvc, plan(isvc))


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def test_one_claim_and_one_job_for_all_replicas_and_no_download_in_any_pod():
    objs = children(cached(size="50Gi", storageClassName="fast", accessMode="ReadWriteMany"))
    [claim] = of_kind(objs, "PersistentVolumeClaim")
    [job] = of_kind(objs, "Job")
    assert claim["metadata"]["name"] == "tiny-model-cache"
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "50Gi"}}}
    assert job["metadata"]["name"].startswith("tiny-model-cache-")
    [fill] = job["spec"]["template"]["spec"]["containers"]
    key = job["metadata"]["name"].removeprefix("tiny-model-cache-")
    # The marker goes in the KEY directory, where `wait` looks, not beside org/repo.
    assert fill["args"] == ["cache", "fill", URI, "--dest", f"/cache/{key}/org/repo",
                            "--cache-dir", f"/cache/{key}", "--progress-port", str(PROGRESS_PORT)]
    assert fill["ports"] == [{"name": "progress", "containerPort": PROGRESS_PORT, "protocol": "TCP"}]
    statefulsets = of_kind(objs, "StatefulSet")
    assert len(statefulsets) == 2
    for sts in statefulsets:
        pod = sts["spec"]["template"]["spec"]
        assert not any(v.get("emptyDir") and v["name"] == "model-cache" for v in pod["volumes"])
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "tiny-model-cache",
                                                                 "readOnly": True}} in pod["volumes"]
        [init] = pod["initContainers"]
        assert init["name"] == "wait-model-cache"
        assert init["args"] == [*MARKER_WAIT_ARGS, f"/model-cache/{key}", "--timeout", "3600"]
        assert all("fetch" not in c["args"] for c in pod["initContainers"])
        # The init container sees the whole claim (no subPath the kubelet would create as root).
        assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in init["volumeMounts"]
        mount = {"name": "model-cache", "mountPath": CACHE_DIR, "subPath": key, "readOnly": True}
        assert mount in pod["containers"][0]["volumeMounts"]
    assert f"{CACHE_DIR}/org/repo" in json.dumps(statefulsets[0]["spec"]["template"]["spec"]["containers"][0])


def test_the_cache_is_off_by_default_and_for_models_that_are_not_downloaded():
    assert not of_kind(children(Spec().set("spec.model.uri", URI)), "Job")
    baked = children(Spec().set("spec.model.cache", {"enabled": True}))  # alias: in the image
    assert not of_kind(baked, "Job") and not of_kind(baked, "PersistentVolumeClaim")


def test_a_new_uri_is_a_new_job_and_a_new_directory_of_the_same_claim():
    one = of_kind(children(cached("hf://org/a")), "Job")[0]["metadata"]["name"]
    two = of_kind(children(cached("hf://org/b")), "Job")[0]["metadata"]["name"]
    assert one != two
    assert one == of_kind(children(cached("hf://org/a")), "Job")[0]["metadata"]["name"]  # stable


def test_the_job_gets_the_credentials_and_ca_bundle_and_runs_restricted():
    objs = children(cached("https://models.example/m.gguf#sha256=" + "a" * 64)
                    .set("spec.model.credentials", {"name": "hf", "key": "token"})
                    .set("spec.model.caBundle", {"name": "ca"}))
    [job] = of_kind(objs, "Job")
    pod = job["spec"]["template"]["spec"]
    [fill] = pod["containers"]
    env = {e["name"]: e for e in fill["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["SSL_CERT_FILE"]["value"] == "/etc/frota/ca/ca.crt"
    dest = fill["args"][fill["args"].index("--dest") + 1]
    assert dest.endswith("/m.gguf")  # the fragment is no part of the file name
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    # A wrong checksum fails the Job at once rather than downloading it backoffLimit times more.
    [fail, ignore] = job["spec"]["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {"containerName": "fill", "operator": "In",
                                                          "values": [CacheJob.EXIT_PERMANENT]}}
    assert ignore["action"] == "Ignore"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in pod["volumes"])
    for container in (fill, *[s["spec"]["template"]["spec"]["initContainers"][0]
                              for s in of_kind(objs, "StatefulSet")]):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("version", ["1.33.0", "1.35.0"])
def test_every_child_is_valid_for_kubernetes(version):
    for obj in children(cached(storageClassName="standard")):
        kubernetes_validate.validate(obj, version, strict=True)


JOB = {"metadata": {"name": "j", "uid": "u1"}, "status": {}}


def pod(message: str, created: str = "2026-01-01T00:00:00Z", uid: str = "u1") -> dict:
    return {"metadata": {"creationTimestamp": created, "ownerReferences": [{"uid": uid}]},
            "status": {"containerStatuses": [{"state": {"terminated": {"message": message}}}]}}


def test_status_pending_before_the_job_is_seen_and_while_it_waits():
    assert model_cache_status(None, "j").state == "Pending"
    assert model_cache_status(JOB, "j").state == "Pending"


def test_status_downloading_while_a_pod_runs():
    status = model_cache_status({**JOB, "status": {"active": 1}}, "j")
    assert (status.state, status.percent, status.job) == ("Downloading", None, "j")


def test_status_ready_with_the_bytes_fill_reported():
    job = {**JOB, "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    status = model_cache_status(job, "j", [pod(json.dumps({"bytes": 1234})),
                                           pod(json.dumps({"bytes": 9}), uid="other")])
    assert (status.state, status.bytes, status.percent) == ("Ready", 1234, 100)


def test_status_failed_with_the_jobs_reason_and_the_last_pods_error():
    job = {**JOB, "status": {"failed": 5, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}}
    pods = [pod("old error", "2026-01-01T00:00:00Z"),
            pod("frota cache fill: https://x/m.gguf: sha256 mismatch\n", "2026-01-01T00:05:00Z")]
    status = model_cache_status(job, "j", list(reversed(pods)))
    assert status.state == "Failed"
    assert status.reason.startswith("BackoffLimitExceeded: Job has reached")
    assert status.reason.endswith("sha256 mismatch")
