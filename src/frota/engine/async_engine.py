"""The server's engine: the step loop runs in its own thread (torch releases the GIL inside
ops, so the event loop stays responsive); results reach asyncio through per-request queues."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from frota.engine.config import EngineArgs
from frota.engine.errors import InvalidRequestError
from frota.engine.kv_transfer import KVTransfer, admit_imported
from frota.engine.llm_engine import LLMEngine
from frota.engine.lora.errors import AdapterInfo
from frota.engine.outputs import EngineStats, RequestOutput
from frota.engine.sampling_params import SamplingParams
from frota.engine.sequence import Sequence

if TYPE_CHECKING:
    from frota.engine.loader import Loaded


class AsyncEngine:
    """Streams per-request deltas from a background step loop; `abort` is thread-safe."""

    def __init__(self, args: EngineArgs, loaded: Loaded | None = None) -> None:
        self.engine = LLMEngine(args, loaded=loaded)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.model_config = self.engine.model_config
        self.kv_transfer = KVTransfer(self.engine, self.call)  # disaggregated prefill/decode
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
                       params: SamplingParams, *, adapter: str | None = None,
                       seq: Sequence | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the deltas of one request until it finishes; raises InvalidRequestError (or
        AdapterError for an `adapter` that is not loaded) up front.

        `adapter`: the name of a loaded LoRA adapter to run under; None, the base model.
        `seq`: an already built sequence (from `kv_transfer.new_sequence`), e.g. one whose
        prompt KV was imported; `prompt`, `params` and `adapter` are then unused.
        """
        if self._error is not None:
            raise RuntimeError(f"the engine loop failed: {self._error!r}")
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        if seq is None:
            seq = self.engine.make_sequence(request_id, prompt, params, adapter)
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

    # -- LoRA adapters: read off the engine thread, registered on it ------------------------

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """`LLMEngine.load_adapter`; the files are read in a worker thread, so steps go on."""
        lora = self.engine._lora_on()
        adapter = await asyncio.to_thread(lora.read, name, path)
        return await self._on_engine(lambda e: lora.register(adapter))

    async def unload_adapter(self, name: str) -> None:
        await self._on_engine(lambda e: e.unload_adapter(name))

    async def adapters(self) -> list[AdapterInfo]:
        return await self._on_engine(lambda e: e.adapters())

    async def _on_engine(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """`call(fn)` while the loop runs, else `fn` here (no step can race it then)."""
        if self.is_running and self._error is None:
            return await self.call(fn)
        return fn(self.engine)

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run `fn(engine)` on the engine thread between steps (block pool changes); its result."""
        if self._error is not None or not self.is_running:
            raise RuntimeError("the engine loop is not running")
        future = asyncio.get_running_loop().create_future()
        self._send(("call", (fn, future)))
        return await future

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
                if seq.request_id not in self._streams:
                    self.engine.block_manager.deallocate(seq)  # imported KV, if any
                elif seq.num_generated_tokens:  # KV imported with its first token
                    self._deliver(admit_imported(self.engine, seq), seq.request_id)
                else:
                    self.engine.add_sequence(seq)
            elif kind == "call":
                self._run_call(*arg)
            else:
                out = self.engine.abort(arg)
                if out is not None:
                    self._deliver(out, arg)

    @staticmethod
    def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _run_call(self, fn: Callable[[LLMEngine], Any], future: asyncio.Future) -> None:
        result, error = None, None
        try:
            result = fn(self.engine)
        except Exception as exc:
            error = exc
        future.get_loop().call_soon_threadsafe(self._settle, future, result, error)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished:
                    idle = getattr(self.engine.runner, "idle", None)
                    if idle is not None:  # parallel ranks: a heartbeat to the followers
                        idle()
                    self._wakeup.wait(timeout=0.5)
                    self._wakeup.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out, out.request_id)
            # Shutting down: end every open stream rather than leave its consumer waiting.
            self._apply_commands()
            for request_id in list(self.engine.requests):
                out = self.engine.abort(request_id)
                if out is not None:
                    self._deliver(out, request_id)
        except BaseException as exc:  # surface to every waiting stream rather than hang them
            self._error = exc
            for request_id in list(self._streams):
                self._deliver(exc, request_id)
            raise
