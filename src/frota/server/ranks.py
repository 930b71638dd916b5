"""`frota worker` when a replica spans several ranks: the processes of the group, their
probes and their failure handling (the parallelism itself is `frota.engine.parallel`).

Rank 0 serves the OpenAI API as usual (its engine steps the whole group) and
adds a watchdog: once the engine loop dies (a collective failed or timed out
because a peer is gone), `/ready` turns false and the process exits non-zero,
so Kubernetes restarts the group. Follower ranks run the same command: they
join, load their shard, answer `/health` and `/ready` on their own `--port`
(every rank shares one pod template, so the probes hit every rank), and follow
rank 0's steps until it says stop. A dead rank 0 makes their next collective
fail within the timeout; they exit non-zero too.

Without FROTA_WORLD_SIZE in the environment (no planner), rank 0 spawns its own
local followers on 127.0.0.1, ports `--port + rank`: each runs the command rank 0 was
started with, as the planner's ranks do (one pod template), so this module names no
entry point of its own and no part above the server.

Rank 0's server is seen through `RankZero`, the little of it the group needs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, Protocol

from frota.api.contract import Env, ServingPath

if TYPE_CHECKING:
    from frota.engine.async_engine import AsyncEngine

log = logging.getLogger("frota.server")

WATCH_INTERVAL_S = 0.5


def world_size(args: argparse.Namespace) -> int:
    return (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)


def rank_from_env() -> int:
    return int(os.environ.get(Env.RANK) or os.environ.get(Env.TORCH_RANK) or 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GroupLifecycle(Protocol):
    """Rank 0's phase as the group reads and ends it (`frota.server.lifecycle.Lifecycle`)."""

    @property
    def stopped(self) -> asyncio.Event: ...  # set once the server is shutting down
    @property
    def exit_code(self) -> int: ...
    def fail(self) -> None: ...  # not ready, stop, exit 1


class ServedEngine(Protocol):
    """The engine rank 0 serves (`frota.server.engine_api.EngineBindings`)."""

    @property
    def engine(self) -> AsyncEngine: ...


class RankZero(Protocol):
    """What the group needs of rank 0's server (`frota.server.app.WorkerState`)."""

    @property
    def lifecycle(self) -> GroupLifecycle: ...
    @property
    def bindings(self) -> ServedEngine | None: ...  # None until the engine has loaded
    def engine_alive(self) -> bool: ...  # False once the engine's step loop has died


def follower_argv(port: int) -> list[str]:
    """A local follower's command: this rank's own, interpreter options included, with the
    follower's `--port` last (argparse keeps the last)."""
    return [sys.executable, *sys.orig_argv[1:], "--port", str(port)]


def spawn_local_followers(args: argparse.Namespace) -> list[subprocess.Popen]:
    """No planner: make this process rank 0 of a local group and start ranks 1..N-1."""
    world = world_size(args)
    os.environ.update({Env.WORLD_SIZE: str(world), Env.RANK: "0", Env.MASTER_ADDR: "127.0.0.1",
                       Env.MASTER_PORT: str(_free_port())})
    children = []
    for rank in range(1, world):
        env = {**os.environ, Env.RANK: str(rank)}
        children.append(subprocess.Popen(follower_argv(args.port + rank), env=env))
    log.info("spawned %d local follower ranks", len(children))
    return children


async def watch_group(state: RankZero) -> None:
    """Rank 0: fail the worker (not ready, exit 1) once the engine loop has died."""
    while not state.lifecycle.stopped.is_set():
        if state.bindings is not None and not state.engine_alive():
            log.error("a rank of the group failed (collective error or timeout); exiting so the "
                      "group restarts")
            state.lifecycle.fail()
            return
        await asyncio.sleep(WATCH_INTERVAL_S)


def stop_followers(state: RankZero) -> None:
    """Rank 0, after a graceful drain: tell the followers to exit 0."""
    bindings = state.bindings
    if bindings is None or state.lifecycle.exit_code != 0:
        return
    runner = bindings.engine.engine.runner
    try:
        runner.stop_followers()
    except Exception:  # a follower already gone: nothing left to stop
        log.warning("could not reach every follower rank to stop it")


def exit_now(code: int, children: list[subprocess.Popen] = ()) -> None:  # type: ignore[assignment]
    """Leave without running gloo's destructors, which can block on a dead peer."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Follower:
    """A follower rank: the engine thread follows rank 0; the event loop answers probes."""

    def __init__(self, args: argparse.Namespace, engine_kwargs: dict[str, Any]) -> None:
        self.args = args
        self.engine_kwargs = engine_kwargs
        self.is_ready = False
        self.error: BaseException | None = None
        self.done = threading.Event()

    def _follow(self) -> None:
        try:
            from frota.engine import EngineArgs
            from frota.engine.llm_engine import LLMEngine

            engine = LLMEngine(EngineArgs(**self.engine_kwargs))
            self.is_ready = True
            log.info("rank %d joined and loaded; following rank 0", engine.parallel.pc.rank)
            engine.runner.follow()
            log.info("rank 0 said stop")
        except BaseException as exc:
            log.exception("follower rank failed")
            self.error = exc
        finally:
            self.is_ready = False
            self.done.set()

    async def serve(self) -> int:
        from aiohttp import web

        async def health(_: web.Request) -> web.Response:
            ok = self.error is None
            return web.json_response({"status": "ok" if ok else "failed"}, status=200 if ok else 503)

        async def ready(_: web.Request) -> web.Response:
            return web.json_response({"status": "ready" if self.is_ready else "not ready"},
                                     status=200 if self.is_ready else 503)

        app = web.Application()
        app.router.add_get(ServingPath.HEALTH, health)
        app.router.add_get(ServingPath.READY, ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.args.host, self.args.port, reuse_address=True).start()
        log.info("follower rank %d: probes on http://%s:%d", rank_from_env(), self.args.host,
                 self.args.port)
        thread = threading.Thread(target=self._follow, name="frota-follower", daemon=True)
        thread.start()
        loop = asyncio.get_running_loop()
        terminated = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, terminated.set)
        done = asyncio.ensure_future(asyncio.to_thread(self.done.wait))
        term = asyncio.ensure_future(terminated.wait())
        await asyncio.wait({done, term}, return_when=asyncio.FIRST_COMPLETED)
        if not self.done.is_set():
            # SIGTERM: rank 0 drains and then says stop; give it the grace period.
            await asyncio.wait({done}, timeout=self.args.shutdown_grace_period + 10.0)
        await runner.cleanup()
        if not self.done.is_set():
            return 0  # terminated while rank 0 never said stop: leave anyway
        return 1 if self.error is not None else 0


def run_follower(args: argparse.Namespace, engine_kwargs: dict[str, Any]) -> int:
    code = asyncio.run(Follower(args, engine_kwargs).serve())
    exit_now(code)
    return code
