"""Run `frota up` as a real subprocess and watch its output (shared by the local tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from openai import OpenAI

FAKE_LAUNCHER = f"{sys.executable} {Path(__file__).parent / 'fake_fleet.py'}"
BANNER = "Frota is serving"


class UpProcess:
    """`frota up ARGS` in its own session, its output collected line by line."""

    def __init__(self, *args: str, state_dir: Path, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "FROTA_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self.state_dir = state_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frota.cli.main", "up", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._eof = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        """Block until `text` appears in the output; raise with the output if it does not."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(text in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise AssertionError(f"no {text!r} within {timeout} s; output:\n{self.output}")
                self._cond.wait(min(left, 0.5))

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal `frota up` and wait for it to exit; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill_everything(self) -> None:
        """Test cleanup: whatever is left of the tree, gone."""
        for child in self.children():
            child.kill()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def all_gone(procs: list[psutil.Process]) -> bool:
    """True when none of these processes lives on (zombies count as gone)."""
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def client(port: int) -> OpenAI:
    """The official client, pointed at a local router; no retries, so failures show."""
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                  timeout=300)
