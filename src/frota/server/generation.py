"""Runs one HTTP request's engine work: admission, n choices, streaming, accounting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from frota.engine.errors import InvalidRequestError
from frota.engine.lora import AdapterError
from frota.engine.outputs import RequestOutput
from frota.engine.sampling_params import SamplingParams
from frota.server import errors
from frota.server.engine_api import EngineBindings
from frota.server.formats import Choice, Format, TokenLogprob, usage
from frota.server.metrics import ServerMetrics

log = logging.getLogger("frota.server.requests")


class ChunkSink(Protocol):
    """Where stream chunks go (`frota.server.streaming.EventStream`)."""

    def send(self, chunk: dict[str, Any]) -> None:
        """Queue one chunk (a JSON-able dict); it goes out with the next flush."""

    async def flush(self) -> None:
        """Write every queued chunk, in one write."""


StartStream = Callable[[], Awaitable[ChunkSink]]


@dataclass
class Job:
    """One HTTP request's engine work: every prompt times `n` choices."""

    request_id: str
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per choice, prompt-major
    n: int
    fmt: Format
    include_usage: bool = False
    kv_seq: Any = None  # decode role: an engine sequence with imported prompt KV (kv_routes)
    echo_texts: list[str] | None = None  # completions `echo`: each prompt's text leads its choices
    adapter: str | None = None  # the LoRA adapter the request's `model` named (None: the base)

    @property
    def num_choices(self) -> int:
        return len(self.params)

    def engine_id(self, index: int) -> str:
        return self.request_id if self.num_choices == 1 else f"{self.request_id}-{index}"

    def prompt_of(self, index: int) -> list[int]:
        return self.prompts[index // self.n]


@dataclass
class _Progress:
    """Per-HTTP-request bookkeeping, for metrics and the completion log line."""

    start: float
    choices: list[Choice]
    last_output: list[float | None]
    finished: list[bool]
    first_token_at: float | None = None
    status: str = "ok"
    extra: dict[str, Any] = field(default_factory=dict)


def prompt_logprobs(prompt: list[int], out: RequestOutput) -> list[TokenLogprob]:
    """The engine's `prompt_logprobs` (None for the first token) as triples, one per token."""
    scores = getattr(out, "prompt_logprobs", None) or []
    result: list[TokenLogprob] = []
    for i, token_id in enumerate(prompt):
        entry = scores[i] if i < len(scores) else None
        if entry is None:
            result.append((int(token_id), None, None))
            continue
        top = sorted(entry.top_logprobs.items(), key=lambda p: -p[1])
        result.append((int(token_id), float(entry.logprob), [(int(t), float(v)) for t, v in top]))
    return result


def token_logprobs(out: RequestOutput) -> list[TokenLogprob]:
    """The engine's `new_logprobs` (TokenLogprob objects) as (token, logprob, top) triples."""
    result: list[TokenLogprob] = []
    for entry in out.new_logprobs or []:
        top = sorted(entry.top_logprobs.items(), key=lambda p: -p[1])
        result.append((int(entry.token_id), float(entry.logprob),
                       [(int(t), float(v)) for t, v in top]))
    return result


class Generation:
    """Admits requests, drives the engine and shapes replies; one per app."""

    def __init__(self, bindings: EngineBindings, metrics: ServerMetrics,
                 max_queue: int | None) -> None:
        self.bindings = bindings
        self.engine = bindings.engine
        self.metrics = metrics
        self.max_queue = max_queue
        # Engine requests admitted that have produced no output yet: queued or
        # in prefill. Counted here (not only from engine.stats()) so a burst is
        # bounded even before the engine thread has seen it.
        self.num_without_output = 0
        self.active: dict[str, Job] = {}

    def abort_all(self) -> None:
        """Abort every in-flight engine request (the end of a shutdown grace period)."""
        for job in list(self.active.values()):
            for i in range(job.num_choices):
                with contextlib.suppress(Exception):
                    self.engine.abort(job.engine_id(i))

    def admit(self, num_requests: int) -> None:
        """Raise 429 when admitting `num_requests` would overfill the waiting queue."""
        if self.max_queue is None:
            return
        waiting = max(self.num_without_output, self.engine.stats().num_waiting)
        if waiting + num_requests > self.max_queue and waiting > 0:
            self.metrics.observe_rejected(429)
            raise errors.queue_full(retry_after_s=1)

    async def run(self, job: Job,
                  start_stream: StartStream | None) -> dict[str, Any] | None:
        """Run `job`; stream through `start_stream` when given, else return the body.

        Streamed: one flush per engine output (all the tokens one engine step gave a
        choice); the chunks of the output that ends the job, and the usage chunk, stay
        queued for the caller's closing write (`EventStream.finish`)."""
        self.num_without_output += job.num_choices
        self.active[job.request_id] = job
        k = job.num_choices
        progress = _Progress(
            start=time.monotonic(),
            choices=[Choice(index=i) for i in range(k)],
            last_output=[None] * k,
            finished=[False] * k,
        )
        events = self._events(job)
        try:
            return await self._drive(job, events, progress, start_stream)
        except asyncio.CancelledError:
            progress.status = "cancelled"
            raise
        except errors.APIError as exc:
            progress.status = f"error {exc.status}"
            raise
        except Exception:
            progress.status = "error 500"
            raise
        finally:
            self.active.pop(job.request_id, None)
            await events.aclose()
            self._release(job, progress)
            self._log(job, progress)

    async def _drive(self, job: Job, events: AsyncIterator[tuple[int, RequestOutput]],
                     progress: _Progress,
                     start_stream: StartStream | None) -> dict[str, Any] | None:
        sink: ChunkSink | None = None
        prompt_tokens = [0] * len(job.prompts)
        async for index, out in events:
            choice = progress.choices[index]
            entries = token_logprobs(out) if job.fmt.want_logprobs else []
            text = out.new_text
            if job.echo_texts is not None and progress.last_output[index] is None:
                text = job.echo_texts[index // job.n] + text
                if job.fmt.want_logprobs:
                    entries = prompt_logprobs(job.prompt_of(index), out) + entries
            self._account(index, out, progress)
            prompt_tokens[index // job.n] = out.num_prompt_tokens
            choice.num_prompt_tokens = out.num_prompt_tokens
            choice.num_generated_tokens = out.num_generated_tokens
            finish = out.finish_reason if out.finished else None
            if start_stream is None:
                choice.text += text
                choice.logprobs.extend(entries)
                choice.finish_reason = finish or choice.finish_reason
                continue
            if sink is None:
                sink = await start_stream()
                for opening in job.fmt.opening_chunks(job.num_choices):
                    sink.send(opening)
            if text or finish or entries:
                for chunk in job.fmt.chunks(index, text, entries, finish):
                    sink.send(chunk)
            if not all(progress.finished):
                await sink.flush()
        completion_tokens = sum(c.num_generated_tokens for c in progress.choices)
        usage_ = usage(sum(prompt_tokens), completion_tokens)
        if start_stream is None:
            return job.fmt.body(progress.choices, usage_)
        if sink is None:  # no output at all (cannot happen with a sound engine)
            sink = await start_stream()
        if job.include_usage:
            sink.send(job.fmt.usage_chunk(usage_))
        return None

    def _account(self, index: int, out: RequestOutput, progress: _Progress) -> None:
        now = time.monotonic()
        last = progress.last_output[index]
        if last is None:
            self.num_without_output -= 1
            self.metrics.observe_first_token(now - progress.start)
            if progress.first_token_at is None:
                progress.first_token_at = now
            if len(out.new_token_ids) > 1:
                self.metrics.observe_tokens(0.0, len(out.new_token_ids) - 1)
        else:
            self.metrics.observe_tokens(now - last, len(out.new_token_ids))
        progress.last_output[index] = now
        if out.finished:
            progress.finished[index] = True
            progress.choices[index].finish_reason = out.finish_reason
            self.metrics.observe_finished(now - progress.start, out.num_prompt_tokens,
                                          out.num_generated_tokens, out.finish_reason or "abort")

    async def _events(self, job: Job) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every choice's outputs, tagged with the choice index, as they arrive."""
        extra: dict[str, Any] = {} if job.kv_seq is None else {"seq": job.kv_seq}
        if job.adapter is not None:
            extra["adapter"] = job.adapter
        gens = [self._checked(self.engine.generate(job.engine_id(i), job.prompt_of(i), p, **extra),
                              job.adapter)
                for i, p in enumerate(job.params)]
        if len(gens) == 1:
            async for out in gens[0]:
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, gen: AsyncIterator[RequestOutput]) -> None:
            try:
                async for out in gen:
                    queue.put_nowait((i, out))
            except Exception as exc:
                queue.put_nowait((i, exc))
            finally:
                queue.put_nowait((i, None))

        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _checked(self, gen: AsyncIterator[RequestOutput],
                       adapter: str | None = None) -> AsyncIterator[RequestOutput]:
        """Engine outputs, with the engine's InvalidRequestError turned into a 400 (and an
        adapter unloaded since the request named it into a 404 `model_not_found`)."""
        try:
            async for out in gen:
                yield out
        except InvalidRequestError as exc:
            raise errors.from_engine(exc) from exc
        except AdapterError as exc:
            if getattr(exc, "code", None) == "adapter_not_found":
                raise errors.model_not_found(adapter or "") from exc
            raise errors.invalid(str(exc), param="model", code=exc.code) from exc
        finally:
            aclose = getattr(gen, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _release(self, job: Job, progress: _Progress) -> None:
        """Abort unfinished engine requests (frees their KV blocks) and fix the counters."""
        for i, done in enumerate(progress.finished):
            if progress.last_output[i] is None:
                self.num_without_output -= 1
            if not done:
                try:
                    self.engine.abort(job.engine_id(i))
                except Exception:  # an engine that already forgot the id
                    log.debug("abort of %s failed", job.engine_id(i), exc_info=True)

    def _log(self, job: Job, progress: _Progress) -> None:
        now = time.monotonic()
        reasons = [c.finish_reason for c in progress.choices]
        record = {
            "id": job.request_id,
            "status": progress.status,
            "n": job.num_choices,
            "prompt_tokens": sum(len(p) for p in job.prompts),
            "generation_tokens": sum(c.num_generated_tokens for c in progress.choices),
            "ttft_s": None if progress.first_token_at is None
            else round(progress.first_token_at - progress.start, 6),
            "total_s": round(now - progress.start, 6),
            "finish_reason": reasons[0] if len(reasons) == 1 else reasons,
        }
        log.info("request finished", extra={"fields": record})
