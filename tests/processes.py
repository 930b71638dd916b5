"""Child processes serving HTTP, for the tests that run real `frota` processes and for the
benchmarks in bench/ (which put the repository on sys.path to import this module).

A process listens on 127.0.0.1 at a port picked free beforehand, writes its output to a
log file, is sent SIGTERM when the process that started it dies (however it dies), and
is stopped with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    import psutil

REPO = Path(__file__).resolve().parents[1]
# Readiness probes go straight to 127.0.0.1, never through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# The kind of a process's CPU-time clock that counts nanoseconds on CPU (linux/posix-timers.h).
_CPUCLOCK_SCHED = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """Runs in the child: SIGTERM it when its parent dies, even when the parent is killed."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def frota_argv(*args: str, port: int) -> list[str]:
    """`frota <args>` listening on 127.0.0.1:`port`, run by this interpreter."""
    return [sys.executable, "-m", "frota.cli.main", *args, "--host", "127.0.0.1",
            "--port", str(port)]


class ServingProcess:
    """`argv` run from the repository root, serving HTTP on 127.0.0.1:`port`; its output
    goes to `log_path` (emptied here, appended to on each restart). `env` is added to
    this process's environment."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name, self.argv, self.port, self.log_path = name, argv, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **(env or {})}
        log_path.write_bytes(b"")
        self.popen = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=REPO, env=self.env, preexec_fn=die_with_parent)

    def start(self) -> None:
        """Start it again (after `kill` or `stop`), on the same port."""
        self.popen = self._spawn()

    def wait_ready(self, timeout_s: float = 240, path: str = "/ready") -> Self:
        """Poll `path` until it answers 200; fail at once if the process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) before it "
                                   f"was ready; {self._log_tail()}")
            try:
                with _DIRECT.open(self.url + path, timeout=2) as r:
                    if r.status == 200:
                        return self
            # Not listening yet, not 2xx, or a connection cut mid-answer: not ready.
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s; {self._log_tail()}")

    async def wait_ready_async(self, timeout_s: float = 240, path: str = "/ready") -> Self:
        """`wait_ready` off the event loop, so that other processes can be waited on at once."""
        return await asyncio.to_thread(self.wait_ready, timeout_s, path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _log_tail(self) -> str:
        return f"the end of {self.log_path}:\n{self.log()[-3000:]}"

    def cpu_seconds(self) -> float:
        """CPU time of the process and its children (a launcher may exec a server), to
        the nanosecond where the kernel allows (`process_cpu_seconds`)."""
        import psutil

        process = psutil.Process(self.popen.pid)
        return sum(process_cpu_seconds(p) for p in [process, *process.children(recursive=True)])

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM, and SIGKILL if it has not exited after `grace_s` seconds."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()


def process_cpu_seconds(process: psutil.Process) -> float:
    """`process`'s CPU time, all its threads (exited ones too), read from its CPU-time
    clock (clock_getcpuclockid(3); Linux lets any process read another's) in nanoseconds.
    psutil's user + system time is counted in clock ticks (10 ms): a benchmark pass of
    60 ms of router CPU over 512 requests would be known to 0.02 ms per request, the
    size of the differences it is meant to show. Where that clock cannot be read, the
    ticks."""
    try:
        return time.clock_gettime((~process.pid << 3) | _CPUCLOCK_SCHED)
    except OSError:
        times = process.cpu_times()
        return times.user + times.system
