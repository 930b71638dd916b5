"""SIGTERM while requests are in flight: readiness drops, new requests get 503,
in-flight streams finish, and the process exits 0."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from tests.server.conftest import SYNTHETIC
from tests.server.harness import WorkerProcess

pytestmark = pytest.mark.slow


def stream_to_end(url: str, results: list, started: threading.Event) -> None:
    body = {"model": SYNTHETIC, "prompt": "hello", "max_tokens": 450, "ignore_eos": True,
            "stream": True, "temperature": 0}
    finish, done = None, False
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            started.set()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
    results.append((resp.status_code, finish, done))


def test_sigterm_drains_in_flight_requests_and_exits_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    worker = WorkerProcess(SYNTHETIC, "--max-model-len", "512", "--num-kv-blocks", "256",
                           "--shutdown-grace-period", "60",
                           log_path=tmp_path / "worker.log").wait_ready()
    try:
        results: list = []
        events = [threading.Event() for _ in range(4)]
        threads = [threading.Thread(target=stream_to_end, args=(worker.url, results, e))
                   for e in events]
        for t in threads:
            t.start()
        for e in events:
            assert e.wait(30)
        worker.terminate()
        # Draining: not ready, new work refused with an OpenAI-shaped 503.
        deadline = time.monotonic() + 10
        while httpx.get(f"{worker.url}/ready", timeout=5).status_code == 200:
            assert time.monotonic() < deadline, "still ready 10s after SIGTERM"
            time.sleep(0.01)
        late = httpx.post(f"{worker.url}/v1/completions", timeout=5,
                          json={"model": SYNTHETIC, "prompt": "x", "max_tokens": 1})
        assert late.status_code == 503 and late.json()["error"]["code"]
        for t in threads:
            t.join(60)
        assert results == [(200, "length", True)] * 4
        assert worker.proc.wait(30) == 0
        draining = re.search(r'"msg": "draining: (\d+) requests in flight', worker.log())
        assert draining and int(draining.group(1)) >= 1, worker.log()[-2000:]
        assert '"exit_code": 0' in worker.log()
    finally:
        worker.stop()
