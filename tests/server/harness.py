"""Serving helpers for tests: an app on a background thread, a real `frota worker` process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from aiohttp import web

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def app_in_thread(app: web.Application) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 from a background event loop; yields its base URL."""
    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)

    async def up() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(up(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 300) -> None:
    """Poll /ready until 200; fail early if the process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


class WorkerProcess:
    """A `frota worker` subprocess on a free port; logs go to a file for inspection."""

    def __init__(self, model: str, *args: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [str(Path(sys.executable).with_name("frota")), "worker", "--model", model,
               "--host", "127.0.0.1", "--port", str(self.port), *args]
        # One intra-op thread: test workers share a few cores with everything else, and
        # oversubscribed torch threads slow a tiny model down by an order of magnitude.
        env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=REPO)

    def wait_ready(self, timeout_s: float = 300) -> WorkerProcess:
        try:
            wait_ready(self.url, self.proc, timeout_s)
        except Exception:
            self.stop()
            raise RuntimeError(f"{self}: not ready\n{self.log()[-4000:]}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __repr__(self) -> str:
        return f"WorkerProcess({self.url}, pid={self.proc.pid})"


def load_tokenizer(model: str):  # type: ignore[no-untyped-def]
    """The engine's tokenizer for `model` without loading its weights (GGUF or synthetic)."""
    from frota.engine.loader import resolve_model

    source = resolve_model(model)
    if source.kind == "synthetic":
        from frota.engine.loader.synthetic import parse_spec
        from frota.engine.tokenizer import ByteTokenizer

        return ByteTokenizer(parse_spec(source.path)[0].vocab_size)
    if source.kind == "gguf":
        import gguf

        from frota.engine.loader.gguf import read_config, read_tokenizer

        reader = gguf.GGUFReader(source.path)
        return read_tokenizer(reader, read_config(reader))
    import torch

    from frota.engine.loader import load_model

    return load_model(model, torch.float32, torch.device("meta"), verbose=False)[2]
