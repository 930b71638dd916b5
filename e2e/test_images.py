"""The images, run the way the Kubernetes `restricted` profile runs them (Docker, no cluster).

Read-only root filesystem with /tmp writable (the pods' emptyDir), numeric non-root user,
every capability dropped, no privilege escalation. The worker must serve the OpenAI API with
its prebuilt C++ kernels (no compiler in the image, nothing to compile on a read-only root)
and exit 0 on SIGTERM; the operator image must not contain torch; the vLLM image must be the
worker's runtime plus vLLM, and run vLLM's CPU build.

Build the images with ``bash scripts/images.sh``. ``FROTA_E2E_IMAGE`` names the worker image
(default frota-worker:dev), ``FROTA_E2E_OPERATOR_IMAGE`` the operator's (frota-operator:dev),
``FROTA_E2E_VLLM_IMAGE`` vLLM's (frota-vllm-cpu:dev).
Each test skips, saying why, where Docker or its image is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

WORKER_IMAGE = os.environ.get("FROTA_E2E_IMAGE", "frota-worker:dev")
OPERATOR_IMAGE = os.environ.get("FROTA_E2E_OPERATOR_IMAGE", "frota-operator:dev")
VLLM_IMAGE = os.environ.get("FROTA_E2E_VLLM_IMAGE", "frota-vllm-cpu:dev")
VLLM_ENV_SCRIPT = Path(__file__).parents[1] / "scripts" / "vllm-env.sh"  # owns the vLLM pins
RESTRICTED = ("--read-only", "--tmpfs", "/tmp", "--user", "10001:10001",
              "--cap-drop", "ALL", "--security-opt", "no-new-privileges")
READY_TIMEOUT_S = 300


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def need_image(image: str) -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (bash scripts/docker.sh start installs and starts Docker)")
    if docker("info", check=False).returncode != 0:
        pytest.skip("Docker is not running: bash scripts/docker.sh start")
    if docker("image", "inspect", image, check=False).returncode != 0:
        pytest.skip(f"no image {image}: build it with bash scripts/images.sh")


@dataclass
class Worker:
    container: str
    base_url: str
    seconds_to_ready: float

    def logs(self) -> str:
        result = docker("logs", self.container, check=False)
        return result.stdout + result.stderr


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    """The worker image serving SmolLM2 under the restricted profile, Ready."""
    need_image(WORKER_IMAGE)
    name = f"frota-e2e-worker-{os.getpid()}"
    start = time.monotonic()
    docker("run", "-d", "--name", name, *RESTRICTED, "-p", "127.0.0.1::8000",
           "-e", "FROTA_MODEL=smollm2", "-e", "FROTA_MAX_MODEL_LEN=512", WORKER_IMAGE)
    try:
        port = docker("port", name, "8000/tcp").stdout.split()[0].rsplit(":", 1)[1]
        w = Worker(name, f"http://127.0.0.1:{port}", 0.0)
        while _get(f"{w.base_url}/ready") != 200:
            state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
            if state != "true":
                pytest.fail(f"the worker container exited before it was ready:\n{w.logs()}")
            if time.monotonic() - start > READY_TIMEOUT_S:
                pytest.fail(f"the worker was not ready within {READY_TIMEOUT_S} s:\n{w.logs()}")
            time.sleep(0.5)
        w.seconds_to_ready = time.monotonic() - start
        print(f"\n{WORKER_IMAGE}: docker run to /ready in {w.seconds_to_ready:.1f} s")
        yield w
    finally:
        docker("rm", "-f", name, check=False)


def test_worker_serves_openai_chat_and_streams(worker: Worker) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{worker.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content.strip()
    assert reply.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,
                                            temperature=0, stream=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "".join(pieces) == reply.choices[0].message.content


def test_worker_uses_its_prebuilt_kernels(worker: Worker) -> None:
    logs = worker.logs()
    assert "C++ CPU kernels: using the prebuilt" in logs, logs
    for fallback in ("C++ CPU kernels unavailable", "compiling the C++ CPU kernels", "building for this CPU"):
        assert fallback not in logs, logs


def test_worker_exits_0_on_sigterm(worker: Worker) -> None:
    """Last in the module: `docker stop` sends SIGTERM, the worker drains and exits 0."""
    docker("stop", "-t", "60", worker.container, timeout=90)
    code = docker("inspect", "-f", "{{.State.ExitCode}}", worker.container).stdout.strip()
    assert code == "0", worker.logs()


def test_operator_image_has_no_torch_and_runs_restricted() -> None:
    need_image(OPERATOR_IMAGE)
    torch = docker("run", "--rm", *RESTRICTED, "--entrypoint", "python", OPERATOR_IMAGE,
                   "-c", "import torch", check=False)
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr, torch.stderr
    cli = docker("run", "--rm", *RESTRICTED, OPERATOR_IMAGE, "--help", check=False)
    assert cli.returncode == 0 and "usage: frota" in cli.stdout, cli.stdout + cli.stderr


def _layers(image: str) -> list[str]:
    return docker("image", "inspect", image, "--format", "{{json .RootFS.Layers}}").stdout.strip()[2:-2].split('","')


def test_vllm_image_is_one_layer_set_over_the_workers_runtime_and_runs_restricted() -> None:
    need_image(VLLM_IMAGE)
    need_image(WORKER_IMAGE)
    vllm, worker = _layers(VLLM_IMAGE), _layers(WORKER_IMAGE)
    shared = next(i for i, (a, b) in enumerate(zip(vllm, worker, strict=False)) if a != b)
    # Base, system packages and the venv with torch are the worker's own layers; vLLM adds
    # its libnuma and its environment.
    assert len(vllm) - shared <= 2, (len(vllm), shared)
    assert shared >= 3, shared
    version = docker("run", "--rm", *RESTRICTED, "--entrypoint", "vllm", VLLM_IMAGE, "--version",
                     check=False, timeout=300)
    assert version.returncode == 0, version.stdout + version.stderr
    pinned = subprocess.run(["bash", str(VLLM_ENV_SCRIPT), "versions"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert version.stdout.strip().splitlines()[-1].startswith(pinned[0]), version.stdout
    torch = docker("run", "--rm", *RESTRICTED, "--entrypoint", "python", VLLM_IMAGE, "-c",
                   "import torch, vllm.platforms as p; print(torch.__version__, p.current_platform.device_type)",
                   check=False, timeout=300)
    assert torch.returncode == 0, torch.stderr
    torch_version, platform = torch.stdout.split()[-2:]
    # The registry's torch (its local version names the CUDA build), on vLLM's CPU platform.
    assert torch_version.split("+")[0] == pinned[1] and platform == "cpu", torch.stdout
