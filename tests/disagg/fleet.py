"""Real `frota worker` / `frota router` processes for the disaggregation tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
FROTA = str(Path(sys.executable).with_name("frota"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even when it is killed."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Proc:
    """A frota process serving HTTP on a free port; its log goes to a file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [FROTA, *argv, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
            preexec_fn=die_with_parent)

    def wait_ready(self, timeout_s: float = 240) -> Proc:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s: {self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def worker(name: str, model: str, role: str, log_dir: Path, *extra: str) -> Proc:
    return Proc(name, ["worker", "--model", model, "--role", role, "--dtype", "float32",
                       "--max-num-seqs", "8", *extra], log_dir)


def router(name: str, log_dir: Path, *, decode: list[str], prefill: list[str] | None = None,
           min_prompt_tokens: int = 0, extra: tuple[str, ...] = ()) -> Proc:
    argv = ["router", "--decode-workers", ",".join(decode), "--probe-interval", "0.2", *extra]
    if prefill:
        argv += ["--prefill-workers", ",".join(prefill),
                 "--disagg-min-prompt-tokens", str(min_prompt_tokens)]
    return Proc(name, argv, log_dir)


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples on `url`/metrics whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(predicate, timeout_s: float = 30, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")
