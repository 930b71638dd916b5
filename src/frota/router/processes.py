"""Several router processes on one port (`frota router --processes N`).

The supervisor serves nothing itself: it starts N copies of its own command line, each
marked with its index in `FROTA_ROUTER_PROCESS`, and each listening on the same port
with `SO_REUSEPORT`, so the kernel spreads new connections over them. Each child runs
the whole router with its share of the admission limits (`admission.process_share`);
the prefix-aware placement needs no shared state, so children agree on where a prefix
goes (`policies.prefix_aware`).

SIGTERM or SIGINT to the supervisor goes on to every child as SIGTERM: each stops
accepting and drains its requests for up to `--drain-timeout`, and the supervisor exits
once all have, with status 0 when all did. A child that dies on its own is restarted
when it had served for `MIN_UPTIME_S`: its siblings keep the port meanwhile, and a
crash in one process (a bug on a rare request) should not cost the others' in-flight
streams, which a pod restart would. A child that dies sooner failed to start (a flag,
the port taken, an unreachable API server): a restart would fail alike, so the
supervisor stops the others and exits with that child's status, and Kubernetes shows
the pod crash-looping with the child's error in its log.

A scrape of `/metrics` lands on whichever process the kernel picks, so the one that
answers gathers its siblings' metrics too: each child also listens on a Unix socket in
a directory the supervisor made (`SOCKETS_ENV`), where it serves its own `/metrics`
only, and the answer labels every sample with its `process`
(`frota.router.metrics.merge_processes`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

#: Set in each child: its index, 0 to N-1.
PROCESS_ENV = "FROTA_ROUTER_PROCESS"
#: Set in each child: the directory of the children's Unix sockets.
SOCKETS_ENV = "FROTA_ROUTER_SOCKETS"
#: A child that exits sooner than this after its start failed to start.
MIN_UPTIME_S = 10.0
_PR_SET_PDEATHSIG = 1


def process_index() -> int | None:
    """This process's index when a supervisor started it, else None."""
    value = os.environ.get(PROCESS_ENV)
    return int(value) if value else None


@dataclass(frozen=True)
class Siblings:
    """A child's place among the supervisor's `count` processes, and where each listens
    for its siblings."""

    index: int
    count: int
    directory: str

    def socket(self, index: int) -> str:
        return os.path.join(self.directory, f"{index}.sock")

    @property
    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


def siblings(index: int | None, count: int) -> Siblings | None:
    """Process `index`'s siblings when a supervisor started it, else None."""
    directory = os.environ.get(SOCKETS_ENV)
    return Siblings(index, count, directory) if index is not None and directory else None


async def read_sibling_metrics(path: str, timeout: float = 2.0) -> str | None:
    """A sibling's own /metrics over its Unix socket; None when it does not answer (it
    is restarting, or stuck past `timeout`)."""
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path),
                timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.get("http://router/metrics") as response:
            return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


def _term_with_parent() -> None:
    """A `preexec_fn`: SIGTERM (drain, not SIGKILL) the child when the supervisor dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class SharedPortSupervisor:
    """Runs `num_processes` copies of `argv` (each with `PROCESS_ENV` set) until a signal
    stops them or one fails to start; see the module docstring for why restart."""

    def __init__(self, argv: Sequence[str], num_processes: int,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.argv = list(argv)
        self.num_processes = num_processes
        self.log = log
        self.children: dict[int, tuple[int, subprocess.Popen[bytes], float]] = {}
        self.is_stopping = False
        self.sockets = ""  # the children's Unix sockets' directory, while they run

    def _spawn(self, index: int) -> None:
        env = {**os.environ, PROCESS_ENV: str(index), SOCKETS_ENV: self.sockets}
        proc = subprocess.Popen(self.argv, env=env, preexec_fn=_term_with_parent)
        self.children[proc.pid] = (index, proc, time.monotonic())

    def _stop(self, *_: object) -> None:
        self.is_stopping = True
        for _, proc, _ in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Start the children and wait on them; the exit status of the router command."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        self.sockets = tempfile.mkdtemp(prefix="frota-router-")
        try:
            return self._run()
        finally:
            shutil.rmtree(self.sockets, ignore_errors=True)

    def _run(self) -> int:
        for index in range(self.num_processes):
            self._spawn(index)
        status = 0
        while self.children:
            pid, raw = os.wait()  # resumed after a signal handler runs (PEP 475)
            if pid not in self.children:
                continue
            index, proc, started = self.children.pop(pid)
            proc.returncode = code = os.waitstatus_to_exitcode(raw)
            if self.is_stopping:
                status = status or (code if code > 0 else 0)
                continue
            uptime = time.monotonic() - started
            if uptime < MIN_UPTIME_S:
                self.log(f"frota router: process {index} exited ({code}) {uptime:.1f} s after "
                         "its start; stopping the others")
                self._stop()
                status = code if code > 0 else 1
                continue
            self.log(f"frota router: process {index} exited ({code}) after {uptime:.0f} s; "
                     "restarting it")
            self._spawn(index)
        return status


def supervise(num_processes: int) -> int:
    """Run this command line's router as `num_processes` processes on its port."""
    # The interpreter's own command line (`frota router ...` or `python -m ... router
    # ...`), options included, so each child runs exactly what was run.
    argv = [sys.executable, *sys.orig_argv[1:]]
    return SharedPortSupervisor(argv, num_processes).run()
