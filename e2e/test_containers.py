"""A fleet in real containers on kind: what the kubelet, kube-proxy and the image registry do to it.

One InferenceService of two replicas serves the module; the tests run in file
order (Service routing, kubectl, a killed container, a hung one and its probes,
graceful termination, an image roll-out, an image that cannot be pulled) and each
leaves it Ready.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from e2e import fleet
from e2e.fleet import INSTANCE, REPLICA, ROLE, chat, router_client, wait_ready
from e2e.kube import Cluster, wait_until

NAME = "box"
PROMPT = "What is the capital of France? Answer in one word."
ROUTER_SERVICE_PORT = 80
# The rolled-out tag: the same image under a new name, loaded into the nodes by the test.
ROLLED_IMAGE = "frota-worker:e2e-rolled"
MISSING_IMAGE = "frota-worker:no-such-tag"


@pytest.fixture(scope="module")
def isvc(cluster: Cluster, ns: str) -> str:
    """Two replicas behind least-load routing; roll-outs surge one group at a time."""
    # A quarter core each: a surge group (and a second router) must still fit on the one
    # worker node, which has the machine's two cores to hand out.
    cluster.apply(fleet.small_isvc(NAME, replicas=2, resources={"cpu": "250m", "memory": "2Gi"},
                                   rollout={"maxUnavailable": 0, "maxSurge": 1}), namespace=ns)
    wait_ready(cluster, ns, NAME)
    return NAME


def _openai(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0)


def _router_metrics(cluster: Cluster, ns: str, prefix: str) -> dict[str, float]:
    router = fleet.serving_pods(cluster, ns, NAME, "router")[0]
    return fleet.metrics(cluster, ns, router, fleet.ROUTER_PORT, prefix)


def _total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name)


def test_the_router_is_reached_through_its_cluster_ip(cluster: Cluster, ns: str, isvc: str) -> None:
    status = cluster.get("inferenceservice", isvc, ns)["status"]
    assert status["url"].startswith(f"http://{isvc}.{ns}.svc"), status["url"]
    with cluster.route_to_cluster_ip(ns, isvc) as ip:
        client = _openai(f"http://{ip}:{ROUTER_SERVICE_PORT}/v1")
        try:
            assert "paris" in chat(client, PROMPT).lower()
            assert [m.id for m in client.models.list().data] == ["smollm2"]
        finally:
            client.close()


def test_kubectl_port_forward_to_the_router_service(cluster: Cluster, ns: str, isvc: str) -> None:
    with cluster.reach(ns, f"svc/{isvc}", ROUTER_SERVICE_PORT) as (host, port):
        client = _openai(f"http://{host}:{port}/v1")
        try:
            stream = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": PROMPT}],
                max_tokens=8, temperature=0, stream=True)
            assert "paris" in "".join(c.choices[0].delta.content or "" for c in stream
                                      if c.choices).lower()
        finally:
            client.close()


def test_kubectl_logs_and_exec_reach_a_worker_in_its_locked_down_container(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    pod = fleet.serving_pods(cluster, ns, isvc)[0]
    logs = cluster.kubectl("logs", "-n", ns, pod, "-c", "worker")
    assert "kernels" in logs.lower(), logs[-2000:]  # the engine names the kernels it loaded
    probe = ("import os, pathlib\n"
             "try:\n    pathlib.Path('/opt/x').write_text('x'); rw = True\n"
             "except OSError:\n    rw = False\n"
             "print(os.getuid(), os.getgid(), rw, open('/proc/self/status').read()"
             ".split('CapEff:')[1].split()[0])")
    out = cluster.kubectl("exec", "-n", ns, pod, "-c", "worker", "--", "python", "-c", probe)
    uid, gid, writable, caps = out.split()
    assert (uid, gid) == ("10001", "10001")
    assert writable == "False"  # readOnlyRootFilesystem
    assert int(caps, 16) == 0  # every capability dropped


def test_a_killed_worker_container_is_restarted_and_the_router_routes_around_it(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    victim = fleet.serving_pods(cluster, ns, isvc)[0]
    pod = cluster.get("pod", victim, ns)
    uid, url = pod["metadata"]["uid"], f"http://{pod['status']['podIP']}:{fleet.WORKER_PORT}"
    cluster.kill_container(ns, victim, "worker")
    with router_client(cluster, ns, isvc) as client:
        # The other replica answers while the kubelet restarts the container
        # (and the operator restarts its group as a whole).
        for _ in range(3):
            assert "paris" in chat(client, PROMPT).lower()
    def noticed() -> bool:
        # The kubelet restarts the container; the operator then restarts the group as a
        # whole, so the pod may already be a new one under the same StatefulSet name.
        pod = cluster.get("pod", victim, ns)
        restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))
        return pod["metadata"]["uid"] != uid or restarts > 0 or bool(
            pod["metadata"].get("deletionTimestamp"))

    wait_until("the kubelet to notice the killed container", noticed, timeout=120)
    wait_ready(cluster, ns, isvc)
    after = wait_until("the router to take both workers again", lambda: (
        m := _router_metrics(cluster, ns, "frota_router_"))
        and _total(m, "frota_router_worker_healthy") == 2 and m, timeout=90)
    assert after
    # The killed worker left rotation: the router ejected it (failed requests or probes), or
    # discovery dropped it as its pod turned unready, whichever came first.
    router = fleet.serving_pods(cluster, ns, isvc, "router")[0]
    log = cluster.kubectl("logs", "-n", ns, router)
    assert f"worker ejected: {url}" in log or f"worker removed: {url}" in log, log[-3000:]


def test_a_hung_worker_fails_readiness_then_liveness_and_the_kubelet_restarts_it(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    """A worker that stops answering (SIGSTOP: alive, but frozen) is taken out of its
    Service by the readiness probe while its container still runs, then restarted by the
    liveness probe; the other replica serves throughout."""
    victim = fleet.serving_pods(cluster, ns, isvc)[0]

    def worker_status() -> dict:
        pod = cluster.get("pod", victim, ns)
        return next(c for c in pod["status"]["containerStatuses"] if c["name"] == "worker")

    before = worker_status()
    cluster.signal_container(ns, victim, "worker", "STOP")
    try:
        # Readiness first (every 5 s, 3 failures): unready, but the same container runs on.
        def unready_but_running() -> bool:
            status = worker_status()
            return (not status["ready"] and status["containerID"] == before["containerID"]
                    and "running" in status["state"])

        wait_until("the readiness probe to take the frozen worker out", unready_but_running,
                   timeout=60)
        assert victim not in fleet.serving_pods(cluster, ns, isvc)
        wait_until("the router to leave the frozen worker out", lambda: _total(
            _router_metrics(cluster, ns, "frota_router_"), "frota_router_worker_healthy") == 1,
            timeout=60)
        with router_client(cluster, ns, isvc) as client:
            for _ in range(3):
                assert "paris" in chat(client, PROMPT).lower()

        # Then liveness (every 10 s, 3 failures): the kubelet kills the container.
        def killed_for_liveness() -> dict | None:
            return next((e for e in cluster.events(ns, victim) if e["reason"] == "Killing"
                         and "failed liveness probe" in e.get("message", "")), None)

        killing = wait_until("the kubelet to kill the frozen worker for its liveness probe",
                             killed_for_liveness, timeout=90)
    finally:
        # Let the process take the pending SIGTERM (or be gone already): no 60 s grace wait.
        with contextlib.suppress(Exception):
            cluster.signal_container(ns, victim, "worker", "CONT")
    unhealthy = [e.get("message", "") for e in cluster.events(ns, victim)
                 if e["reason"] == "Unhealthy"]
    assert any(m.startswith("Readiness probe failed") for m in unhealthy), unhealthy
    assert any(m.startswith("Liveness probe failed") for m in unhealthy), unhealthy
    assert "will be restarted" in killing["message"], killing
    wait_ready(cluster, ns, isvc)
    wait_until("the router to take both workers again", lambda: _total(
        _router_metrics(cluster, ns, "frota_router_"), "frota_router_worker_healthy") == 2,
        timeout=90)


def test_deleting_a_worker_pod_lets_its_streams_finish_and_loses_no_request(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    grace = cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})[0][
        "spec"]["terminationGracePeriodSeconds"]
    max_tokens = 48
    started = threading.Barrier(3)

    def stream(client: openai.OpenAI) -> tuple[int, str | None]:
        chunks, finish = 0, None
        for c in client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=max_tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True}):
            if c.choices and c.choices[0].delta.content:
                chunks += 1
                if chunks == 1:
                    started.wait(timeout=120)
            if c.choices and c.choices[0].finish_reason:
                finish = c.choices[0].finish_reason
        return chunks, finish

    with router_client(cluster, ns, isvc) as client, ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, client) for _ in range(2)]
        started.wait(timeout=120)  # both streams are producing tokens
        # Least-load spread them over both workers: whichever pod goes, one stream is on it.
        victim = fleet.serving_pods(cluster, ns, isvc)[0]
        deleted_at = time.monotonic()
        cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
        # Requests that arrive while it drains go to the other replica.
        later = [pool.submit(chat, client, PROMPT, 4) for _ in range(4)]
        results = [f.result(timeout=grace + 60) for f in streams]
        finished_in = time.monotonic() - deleted_at
        answers = [f.result(timeout=grace + 60) for f in later]
    assert all(finish == "length" for _, finish in results), results
    assert all(chunks >= max_tokens // 2 for chunks, _ in results), results
    assert finished_in < grace, finished_in
    assert all(a for a in answers), answers
    wait_ready(cluster, ns, isvc)


def test_a_new_image_tag_rolls_group_by_group_without_a_gap(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    subprocess.run(["docker", "tag", cluster.image, ROLLED_IMAGE], check=True)
    cluster.load_image(ROLLED_IMAGE)
    cluster.kubectl("patch", "inferenceservice", isvc, "-n", ns, "--type=merge",
                    "-p", f'{{"spec": {{"engine": {{"image": "{ROLLED_IMAGE}"}}}}}}')

    def pod_images() -> set[str]:
        return {c["image"] for p in cluster.get("pods", namespace=ns, **{INSTANCE: isvc})
                for c in p["spec"]["containers"]}

    def rolled() -> bool:
        return (pod_images() == {ROLLED_IMAGE}
                and fleet.condition(cluster, ns, isvc, "Ready").get("status") == "True"
                and len(fleet.serving_pods(cluster, ns, isvc)) == 2)

    def starting_groups() -> set[str]:
        """The worker groups (replica index) with a live pod of the new image not Ready yet."""
        return {p["metadata"]["labels"][REPLICA]
                for p in cluster.get("pods", namespace=ns, **{INSTANCE: isvc, ROLE: "worker"})
                if not p["metadata"].get("deletionTimestamp") and not fleet.pod_is_ready(p)
                and p["spec"]["containers"][0]["image"] == ROLLED_IMAGE}

    served, samples = 0, []
    deadline = time.monotonic() + 2 * fleet.MODEL_TIMEOUT
    with cluster.route_to_cluster_ip(ns, isvc) as ip:
        client = _openai(f"http://{ip}:{ROUTER_SERVICE_PORT}/v1")
        try:
            while not rolled():
                assert time.monotonic() < deadline, fleet.describe(cluster, ns, isvc)
                samples.append(starting_groups())
                assert "paris" in chat(client, PROMPT).lower()
                served += 1
        finally:
            client.close()
    assert served > 2
    # Group by group (maxSurge 1, maxUnavailable 0): one new group starts at a time, and
    # more than one group went through it.
    assert all(len(starting) <= 1 for starting in samples), samples
    assert len(set().union(*samples)) >= 2, samples


def test_an_image_that_cannot_be_pulled_is_named_in_status(
    cluster: Cluster, ns: str, isvc: str
) -> None:
    good = cluster.get("inferenceservice", isvc, ns)["spec"]["engine"]["image"]
    patch = '{{"spec": {{"engine": {{"image": "{}"}}}}}}'
    cluster.kubectl("patch", "inferenceservice", isvc, "-n", ns, "--type=merge",
                    "-p", patch.format(MISSING_IMAGE))
    cond = wait_until("Progressing=False with reason ImagePullFailed", lambda: (
        c := fleet.condition(cluster, ns, isvc, "Progressing")).get("reason") == "ImagePullFailed"
        and c, timeout=180)
    assert cond["status"] == "False"
    assert MISSING_IMAGE in cond["message"], cond
    stuck = [p["metadata"]["name"] for p in cluster.get("pods", namespace=ns, **{INSTANCE: isvc})
             if any(c["image"] == MISSING_IMAGE for c in p["spec"]["containers"])]
    assert any(name in cond["message"] for name in stuck), (cond, stuck)
    # Surge-only: the groups of the good image still serve.
    with router_client(cluster, ns, isvc) as client:
        assert "paris" in chat(client, PROMPT).lower()
    cluster.kubectl("patch", "inferenceservice", isvc, "-n", ns, "--type=merge",
                    "-p", patch.format(good))
    wait_until("the fleet back on the good image", lambda: not any(
        c["image"] == MISSING_IMAGE for p in cluster.get("pods", namespace=ns, **{INSTANCE: isvc})
        for c in p["spec"]["containers"]), timeout=120)
    wait_ready(cluster, ns, isvc)
