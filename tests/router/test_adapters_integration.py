"""`frota router --lora-runtime-loading` in front of real `frota worker --enable-lora`
processes (a synthetic model, a seeded PEFT adapter): a load through the router reaches
the worker serving, a worker that starts later gets it before it serves, routing follows
it, and an unload takes it away."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ServingProcess, free_port, frota_argv

pytestmark = pytest.mark.slow

MODEL = "synthetic:dense-tiny"
# Kernels off and one thread: the test pins the router's behaviour, and a tiny model
# starts in seconds this way on a busy machine.
WORKER_ENV = {"FROTA_CPU_KERNELS": "0", "OMP_NUM_THREADS": "1"}
WORKER_ARGS = ("--max-model-len", "256", "--num-kv-blocks", "128", "--max-num-seqs", "4",
               "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
               "--allow-runtime-lora")


def lora_unavailable_reason() -> str | None:
    probe = subprocess.run([sys.executable, "-m", "frota.cli.main", "worker", "--help"],
                           capture_output=True, text=True)
    if probe.returncode or "--enable-lora" not in probe.stdout:
        return "`frota worker` has no --enable-lora here"
    return None


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, raw, headers = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read(), dict(exc.headers)
    try:
        return status, json.loads(raw), headers
    except ValueError:
        return status, raw.decode(), headers


def wait_for(predicate, timeout_s: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.1)


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    reason = lora_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from frota.api.synthetic import parse_synthetic_spec, synthetic_shape
    from tests.engine.lora.adapters import write_adapter

    shape = synthetic_shape(parse_synthetic_spec(MODEL.removeprefix("synthetic:")))
    return write_adapter(tmp_path / "sql", shape, rank=8, targets=["q_proj", "v_proj"])


@pytest.fixture
def processes() -> Iterator[list[ServingProcess]]:
    started: list[ServingProcess] = []
    yield started
    for process in reversed(started):
        process.stop()


def worker(tmp_path: Path, port: int) -> ServingProcess:
    argv = frota_argv("worker", "--model", MODEL, *WORKER_ARGS, port=port)
    return ServingProcess(f"worker-{port}", argv, port, tmp_path / f"worker-{port}.log",
                          env=WORKER_ENV)


def models(url: str) -> list[str]:
    return [m["id"] for m in call("GET", url + "/v1/models")[1]["data"]]


def test_loads_through_the_router_reach_every_worker_and_later_ones(
        tmp_path: Path, adapter: Path, processes: list[ServingProcess]) -> None:
    first_port, late_port, router_port = free_port(), free_port(), free_port()
    first = worker(tmp_path, first_port)
    processes.append(first)
    first.wait_ready(300)
    argv = frota_argv("router", "--probe-interval", "0.2", "--lora-runtime-loading",
                      "--debug-headers",
                      "--workers", f"{first.url},http://127.0.0.1:{late_port}",
                      port=router_port)
    router = ServingProcess("router", argv, router_port, tmp_path / "router.log")
    processes.append(router)
    router.wait_ready(60)
    url = router.url

    status, text, _ = call("POST", url + "/v1/load_lora_adapter",
                           {"lora_name": "sql", "lora_path": str(adapter)})
    assert status == 200 and "sql" in text
    assert "sql" in models(first.url)
    status, body, headers = call("POST", url + "/v1/completions",
                                 {"model": "sql", "prompt": "hi", "max_tokens": 2})
    assert status == 200 and body["model"] == "sql"
    assert headers["x-frota-worker"] == first.url

    late = worker(tmp_path, late_port)  # a replica that starts after the load
    processes.append(late)

    def late_in_rotation() -> bool:
        listed = call("GET", url + "/router/workers")[1]["workers"]
        return any(w["url"] == late.url and w["healthy"] for w in listed)

    wait_for(late_in_rotation, 300)
    assert "sql" in models(late.url)  # replayed before the router sent it anything
    served = {call("POST", url + "/v1/completions",
                   {"model": "sql", "prompt": "hi", "max_tokens": 2})[2]["x-frota-worker"]
              for _ in range(4)}
    assert served == {first.url, late.url}

    assert call("POST", url + "/v1/unload_lora_adapter", {"lora_name": "sql"})[0] == 200
    assert "sql" not in models(first.url) and "sql" not in models(late.url)
    status, body, _ = call("POST", url + "/v1/completions",
                           {"model": "sql", "prompt": "hi", "max_tokens": 2})
    assert status == 404 and body["error"]["code"] == "model_not_found"
