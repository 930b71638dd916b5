"""The server's engine: the step loop runs in its own thread (torch releases the GIL inside
ops, so the event loop stays responsive); results reach asyncio through per-request queues."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator

from frota.engine.config import EngineArgs
from frota.engine.llm_engine import LLMEngine
from frota.engine.outputs import EngineStats, RequestOutput
from frota.engine.sampling_params import SamplingParams
from frota.engine.sequence import Sequence


class AsyncEngine:
    """Streams per-request deltas from a background step loop; `abort` is thread-safe."""

    def __init__(self, args: EngineArgs, loaded: tuple | None = None) -> None:
        self.engine = LLMEngine(args, loaded=loaded)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.model_config = self.engine.model_config
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None

    async def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="frota-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    async def generate(self, request_id: str, prompt: str | list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Yield the deltas of one request until it finishes; raises InvalidRequestError up front."""
        if self._error is not None:
            raise RuntimeError(f"the engine loop failed: {self._error!r}")
        if request_id in self._streams:
            from frota.engine.errors import InvalidRequestError

            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        seq = self.engine.make_sequence(request_id, prompt, params)
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), stream)
        self._send(("add", seq))
        finished = False
        try:
            while True:
                out = await stream.get()
                if isinstance(out, BaseException):
                    raise RuntimeError("the engine loop failed") from out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer went away: stop spending compute on it
                self._send(("abort", request_id))

    def abort(self, request_id: str) -> None:
        """Finish a request (reason "abort"); its blocks are freed before the next step."""
        self._send(("abort", request_id))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _deliver(self, out: RequestOutput | BaseException, request_id: str) -> None:
        entry = self._streams.get(request_id)
        if entry is not None:
            loop, stream = entry
            loop.call_soon_threadsafe(stream.put_nowait, out)

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                seq: Sequence = arg
                if seq.request_id in self._streams:
                    self.engine.add_sequence(seq)
            else:
                out = self.engine.abort(arg)
                if out is not None:
                    self._deliver(out, arg)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished:
                    self._wakeup.wait(timeout=0.5)
                    self._wakeup.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out, out.request_id)
        except BaseException as exc:  # surface to every waiting stream rather than hang them
            self._error = exc
            for request_id in list(self._streams):
                self._deliver(exc, request_id)
            raise
