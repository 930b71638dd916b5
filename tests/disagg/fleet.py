"""Real `frota worker` / `frota router` processes for the disaggregation tests."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from frota.api.contract import FleetKey
from frota.api.fleet_key import Keyring, write_key_file
from tests.metrics_text import metric_sum
from tests.processes import ServingProcess, free_port, frota_argv

__all__ = ["Proc", "fleet_key", "free_port", "internal", "keyring", "metric", "router",
           "wait_for", "worker"]


def fleet_key(log_dir: Path) -> Path:
    """The fleet key of the processes logging to `log_dir` (one fleet), written once."""
    path = log_dir / "fleet.key"
    return path if path.exists() else write_key_file(path)


def keyring(proc: ServingProcess) -> Keyring:
    """The fleet key of `proc`'s fleet, as its peers hold it."""
    return Keyring.from_file(fleet_key(proc.log_path.parent))


def internal(proc: ServingProcess) -> dict[str, str]:
    """The headers of an internal call to `proc` (what its router and peers send)."""
    return dict([keyring(proc).authorization()])


class Proc(ServingProcess):
    """`frota <argv>` serving HTTP on a free port (one torch thread); its log is
    `<log_dir>/<name>.log`. The processes of one `log_dir` share a fleet key."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        port = free_port()
        super().__init__(name, frota_argv(*argv, port=port), port, log_dir / f"{name}.log",
                         env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                              FleetKey.FILE_ENV: str(fleet_key(log_dir))})


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
    return metric_sum(httpx.get(f"{url}/metrics", timeout=5).text, name, **labels)


def wait_for(predicate, timeout_s: float = 30, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")
