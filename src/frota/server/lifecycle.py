"""Worker phases (loading -> ready -> draining) and the serve loop with graceful SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
from collections.abc import Callable, Iterator

from aiohttp import web

log = logging.getLogger("frota.server")


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


class Lifecycle:
    """The worker's phase and its in-flight generation requests."""

    def __init__(self) -> None:
        self.phase = Phase.LOADING
        self.num_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopped = asyncio.Event()  # set when the server should shut down
        self.exit_code = 0

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.READY

    def set_phase(self, phase: Phase) -> None:
        if self.phase is not phase:
            log.info("phase %s -> %s", self.phase.value, phase.value)
        self.phase = phase

    def fail(self) -> None:
        """The engine could not load: stop with a non-zero exit code."""
        self.set_phase(Phase.FAILED)
        self.exit_code = 1
        self.stopped.set()

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        self.num_in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.num_in_flight -= 1
            if self.num_in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False


async def serve(app: web.Application, lifecycle: Lifecycle, host: str, port: int,
                grace_period_s: float, abort_all: Callable[[], None]) -> int:
    """Serve until SIGTERM/SIGINT, then drain: 503 for new requests, wait for in-flight ones."""
    # handler_cancellation: a client that disconnects cancels its handler,
    # which aborts its engine requests and frees their KV blocks at once.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    log.info("listening on http://%s:%d", host, port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lifecycle.stopped.set)
    try:
        await lifecycle.stopped.wait()
        if lifecycle.phase is not Phase.FAILED:
            lifecycle.set_phase(Phase.DRAINING)
            log.info("draining: %d requests in flight, grace period %.1fs",
                     lifecycle.num_in_flight, grace_period_s)
            if not await lifecycle.wait_idle(grace_period_s):
                log.warning("grace period over; aborting %d requests", lifecycle.num_in_flight)
                abort_all()
                await lifecycle.wait_idle(5.0)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    log.info("stopped", extra={"fields": {"exit_code": lifecycle.exit_code}})
    return lifecycle.exit_code

