"""`frota up --scale-to-zero SECONDS`: idle workers stop, the router stays and holds the next
requests, the workers start again and every held request is answered (fake workers behind
Frota's own router)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import psutil

from .conftest import free_port, wait_until
from .fleet_process import BANNER, FAKE_LAUNCHER, UpProcess
from .test_local_up_cli import say_hi


def workers(up: UpProcess) -> list[psutil.Process]:
    """The fake worker processes `frota up` runs now."""
    return [p for p in psutil.Process(up.proc.pid).children(recursive=True)
            if "worker" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE]


def test_idle_workers_stop_and_held_requests_start_them_again(tmp_path: Path):
    port = free_port()
    up = UpProcess("--scale-to-zero", "2", "--port", str(port), "--launcher", FAKE_LAUNCHER,
                   state_dir=tmp_path, env={"FAKE_REAL_ROUTER": "1"})
    try:
        up.wait_for(BANNER, 60)
        assert say_hi(port).startswith("hello from")
        (first,) = workers(up)
        up.wait_for("stopping the workers", 20)
        wait_until(lambda: not workers(up), 15, "the workers to stop")
        assert "router" in up.output and not up.proc.poll()  # frota up and its router stay
        # At zero: 8 requests at once are held by the router and all answered.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: say_hi(port), range(8)))
        assert len(answers) == 8 and all(a.startswith("hello from") for a in answers)
        assert "a request is held: starting the workers" in up.output
        # The router re-admits a worker on its own probe, so it can answer before the idle
        # scaler's readiness poll returns and logs the start time: wait for that line.
        up.wait_for("workers ready in", 20)
        (second,) = workers(up)
        assert second.pid != first.pid  # a new worker process answered
        assert {a for a in answers} == {f"hello from {second.pid}"}  # started once
    finally:
        up.kill_everything()
