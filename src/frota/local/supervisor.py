"""Run process groups the way Kubernetes runs pods: start, probe, restart, stop.

A *group* is the unit of restart: the ranks of one tensor/pipeline-parallel
replica cannot outlive a peer (their collectives would hang), so when any
member dies the whole group is stopped and started again after an exponential
backoff, like a LeaderWorkerSet with `RecreateGroupOnPodRestart`.

Children run in their own session (so a terminal's Ctrl-C reaches only
`frota up`, which then stops them in order) and ask the kernel to kill them if
`frota up` itself dies (`PR_SET_PDEATHSIG`), so even a SIGKILLed supervisor
leaves no orphans. Stopping is SIGTERM to the child's process group, then
SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from frota.api.contract import Role

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessSpec:
    """One local process: what to run and how to tell that it is ready."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    # GET this URL until it answers 200. None: ready as soon as it runs
    # (follower ranks, which serve no HTTP; their leader's probe covers them).
    ready_url: str | None = None
    # Liveness, probed once ready: failing `liveness_failures` times in a row
    # kills the process (and so restarts its group), as a kubelet would.
    live_url: str | None = None
    port: int | None = None
    role: Role = Role.WORKER
    replica: int | None = None
    rank: int = 0


@dataclass(frozen=True)
class GroupSpec:
    """Processes that start, fail and restart together (the ranks of one replica)."""

    name: str
    processes: tuple[ProcessSpec, ...]


class StartupError(RuntimeError):
    """The fleet did not come up; `log_tail` holds the failing process's last lines."""

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail or []


# Events reported to the caller (progress display, state file).
EventSink = Callable[[str, "ManagedProcess", str], None]
LogSink = Callable[["ManagedProcess", str], None]


@dataclass
class ManagedProcess:
    """A process and what the supervisor knows about it."""

    spec: ProcessSpec
    proc: asyncio.subprocess.Process | None = None
    is_ready: bool = False
    num_restarts: int = 0
    started_at: float = 0.0
    ready_at: float = 0.0
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn`: the kernel sends SIGKILL to the child when its parent dies."""

    def preexec() -> None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass(frozen=True)
class Timing:
    """How often the supervisor looks, how long it waits, and how it backs off."""

    probe_interval: float = 0.25  # seconds between readiness probes while starting
    backoff_initial: float = 1.0  # before the first restart of a group; doubles each time
    backoff_max: float = 30.0
    backoff_reset_after: float = 60.0  # a group up this long starts its backoff afresh
    grace_period: float = 10.0  # SIGTERM to SIGKILL
    liveness_period: float = 10.0  # seconds between liveness probes of a ready group
    liveness_timeout: float = 5.0
    liveness_failures: int = 3  # failed probes in a row that restart a group


class Supervisor:
    """Starts groups of processes, waits until they are ready, restarts and stops them."""

    def __init__(self, groups: list[GroupSpec], *, on_event: EventSink | None = None,
                 on_log: LogSink | None = None, timing: Timing = Timing()) -> None:
        self.groups = groups
        self.members: dict[str, list[ManagedProcess]] = {
            g.name: [ManagedProcess(spec) for spec in g.processes] for g in groups
        }
        self._on_event = on_event or (lambda *_: None)
        self._on_log = on_log or (lambda *_: None)
        self.timing = timing
        self._is_stopping = False
        # Scale to zero: groups stopped on purpose (not restarted) until unparked.
        self.parked: set[str] = set()
        self._unparked: dict[str, asyncio.Event] = {g.name: asyncio.Event() for g in groups}
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        atexit.register(self.kill_all_now)

    @property
    def processes(self) -> list[ManagedProcess]:
        return [m for members in self.members.values() for m in members]

    # -- start and readiness ------------------------------------------------

    async def start(self, timeout: float) -> None:
        """Start every group and wait until all are ready.

        A process that exits before it is ready, or a fleet not ready within
        `timeout` seconds, raises StartupError (nothing is restarted yet: a
        worker that cannot start once will not start the next time either).
        The caller stops what is running.
        """
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        for group in self.groups:
            await self._start_group(group.name)
        waits = [self._wait_ready(m) for m in self.processes]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            slow = next((m for m in self.processes if not m.is_ready), None)
            name = slow.spec.name if slow else "fleet"
            raise StartupError(
                f"{name} was not ready after {timeout:.0f} s (raise --ready-timeout?)",
                list(slow.log_tail) if slow else [],
            ) from None

    async def _start_group(self, group: str) -> None:
        for member in self.members[group]:
            await self._spawn(member)

    async def _spawn(self, member: ManagedProcess) -> None:
        spec = member.spec
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        try:
            member.proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except OSError as exc:
            raise StartupError(f"cannot start {spec.name}: {spec.argv[0]}: {exc.strerror}") from exc
        member.is_ready = False
        member.started_at = time.monotonic()
        self._tasks.append(asyncio.create_task(self._pump_logs(member, member.proc)))
        self._on_event("started", member, f"pid {member.pid}")

    async def _pump_logs(self, member: ManagedProcess, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            text = line.decode(errors="replace").rstrip()
            member.log_tail.append(text)
            self._on_log(member, text)

    async def _wait_ready(self, member: ManagedProcess) -> None:
        proc = member.proc
        assert proc is not None
        while True:
            if proc.returncode is not None:
                await asyncio.sleep(0.1)  # let the log pump drain the last lines
                raise StartupError(
                    f"{member.spec.name} exited with code {proc.returncode} before it was ready",
                    list(member.log_tail),
                )
            if await self._probe(member):
                member.is_ready = True
                member.ready_at = time.monotonic()
                self._on_event("ready", member, f"{member.ready_at - member.started_at:.1f} s")
                if member.spec.live_url:
                    self._tasks.append(asyncio.create_task(self._watch_liveness(member, proc)))
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), self.timing.probe_interval)

    async def _probe(self, member: ManagedProcess, url: str | None = None,
                     timeout: float = 2.0) -> bool:
        url = url or member.spec.ready_url
        if url is None:
            return member.is_running
        assert self._session is not None
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _watch_liveness(self, member: ManagedProcess,
                              proc: asyncio.subprocess.Process) -> None:
        num_failures = 0
        while member.proc is proc and proc.returncode is None and not self._is_stopping:
            await asyncio.sleep(self.timing.liveness_period)
            if member.proc is not proc or proc.returncode is not None or self._is_stopping:
                return
            if await self._probe(member, member.spec.live_url, self.timing.liveness_timeout):
                num_failures = 0
                continue
            num_failures += 1
            if num_failures >= self.timing.liveness_failures:
                self._on_event("unhealthy", member,
                               f"{member.spec.live_url} failed {num_failures} times; killing it")
                _killpg(proc.pid, signal.SIGKILL)
                return

    # -- supervision --------------------------------------------------------

    async def supervise(self) -> None:
        """Watch every group; restart a group (with backoff) when a member exits."""
        await asyncio.gather(*(self._supervise_group(g.name) for g in self.groups))

    async def _supervise_group(self, group: str) -> None:
        members = self.members[group]
        num_failures = 0
        while not self._is_stopping:
            if group in self.parked:  # stopped on purpose: nothing to restart until unparked
                await self._unparked[group].wait()
                continue
            waits = [asyncio.ensure_future(m.proc.wait()) for m in members if m.proc]
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in pending:
                fut.cancel()
            if self._is_stopping:
                return
            if group in self.parked:
                continue
            dead = next(m for m in members if not m.is_running)
            uptime = time.monotonic() - dead.started_at
            num_failures = 1 if uptime >= self.timing.backoff_reset_after else num_failures + 1
            delay = min(self.timing.backoff_initial * 2 ** (num_failures - 1), self.timing.backoff_max)
            code = dead.proc.returncode if dead.proc else None
            self._on_event("exited", dead, f"code {code}; restarting group in {delay:.3g} s")
            await asyncio.gather(*(self._stop_one(m) for m in members))
            await asyncio.sleep(delay)
            if self._is_stopping:
                return
            for m in members:
                m.num_restarts += 1
            try:
                await self._start_group(group)
            except StartupError as exc:  # cannot even exec: the next round backs off further
                self._on_event("exited", members[0], str(exc))
                continue
            # A restarted group is probed like a new one, but never fails the fleet.
            await asyncio.gather(*(self._wait_ready_or_exit(m) for m in members))

    async def _wait_ready_or_exit(self, member: ManagedProcess) -> None:
        with contextlib.suppress(StartupError):
            await self._wait_ready(member)

    # -- scale to zero ------------------------------------------------------

    async def park(self, group: str) -> None:
        """Stop a group on purpose: it is not restarted until `unpark`."""
        if group in self.parked:
            return
        self.parked.add(group)
        self._unparked[group].clear()
        await asyncio.gather(*(self._stop_one(m) for m in self.members[group]))
        self._on_event("parked", self.members[group][0], "idle: stopped until a request comes")

    async def unpark(self, group: str, timeout: float) -> bool:
        """Start a parked group again and wait until it is ready (True) or `timeout` passes."""
        if group not in self.parked:
            return True
        await self._start_group(group)
        self.parked.discard(group)
        self._unparked[group].set()
        waits = [self._wait_ready_or_exit(m) for m in self.members[group]]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        return all(m.is_ready for m in self.members[group])

    # -- stop ---------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is left after the grace period."""
        self._is_stopping = True
        await asyncio.gather(*(self._stop_one(m) for m in self.processes))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
        atexit.unregister(self.kill_all_now)

    async def _stop_one(self, member: ManagedProcess) -> None:
        proc = member.proc
        if proc is None:
            return
        member.is_ready = False
        if proc.returncode is None:
            _killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.timing.grace_period)
            except TimeoutError:
                self._on_event("killed", member, f"no exit {self.timing.grace_period:.0f} s after SIGTERM")
        # The leader may be gone while something it started lives on in its group.
        _killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    def kill_all_now(self) -> None:
        """Last resort (atexit, second Ctrl-C): SIGKILL every child's process group."""
        for member in self.processes:
            if member.proc is not None:
                _killpg(member.proc.pid, signal.SIGKILL)
