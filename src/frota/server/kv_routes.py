"""Disaggregated prefill/decode on the worker: the `/internal/kv/` routes and the decode hook.

Prefill role (`--role prefill|both`):
- `POST /internal/kv/prefill/v1/completions` (and `.../v1/chat/completions`) takes the
  client's OpenAI body, runs the prompt with max_tokens=1 and answers with the first
  token and a KV handle; the prompt's blocks stay pinned until fetched, released, or
  `--kv-handle-ttl` seconds pass (then they are freed and counted as expired). At most
  `--kv-max-pinned-handles` handles are pinned at once; beyond that the oldest is evicted.
- `GET /internal/kv/blocks/{id}` streams the pinned blocks (framing below) once and frees them.
- `DELETE /internal/kv/blocks/{id}` frees them without a transfer.

Decode role (`--role decode|both`): an OpenAI request carrying the `x-frota-kv-handle`
header (JSON: url, id, fingerprint, prompt_digest, num_prompt_tokens, first_token, adapter,
expires_at, sig) pulls the blocks from the prefill worker into freshly allocated blocks of
its own pool and continues decoding from the first token. A layout mismatch answers 409; a
prefill peer that is gone or forgot the handle answers 424 (`kv_transfer_failed`), so the
router can run the request colocated instead.

Trust: a handle is the fleet's word, not a client's. The prefill worker signs it with the
fleet key (`frota.api.fleet_key`; the router re-signs it when it fills in the URL), and the
decode worker checks the signature and the expiry before anything else: a handle that fails
is a 403 and the worker connects nowhere. The routes under `/internal/` need the fleet's
credential (`frota.server.fleet_auth`), which the decode worker sends when it pulls. What a
refusal says names no URL, fingerprint or layout; the worker's log has them, with the
request's id.

LoRA: the handle names the adapter the prefill ran under (`adapter`, null for the base
model), and so does the block stream's header. A decode request whose `model` names another
adapter (or the base model) is refused with a 409 `kv_adapter_mismatch` before anything is
pulled, and again if the stream's header disagrees: KV computed under one adapter never
continues under another.

Framing of a block stream: 4 bytes big-endian header length, the JSON header
(`fingerprint`, `layout`, `num_prompt_tokens`, `num_blocks`, `parts`: shape/dtype/nbytes
of each storage tensor, per layer K then V), then each part's raw bytes in that order.
The decode side reads part by part and copies each into its blocks as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import struct
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram
from pydantic import ValidationError

from frota.api.contract import EngineRole, InternalHeader, ServingPath, WorkerPath
from frota.api.fleet_key import Keyring
from frota.api.openai_requests import ChatCompletionRequest, CompletionRequest
from frota.engine.errors import InvalidRequestError
from frota.engine.lora import AdapterError
from frota.server import errors
from frota.server.adapters import from_adapter_error
from frota.server.app import STATE_KEY, WorkerState, _read_json
from frota.server.fleet_auth import forbidden, request_id
from frota.server.generation import Job
from frota.server.jobs import chat_job, completion_job

log = logging.getLogger("frota.server.kv")

# A request's verified handle, set by `KVService.check_handle`.
HANDLE_KEY = web.RequestKey("kv_handle", dict)
TRANSFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BUILDERS = {ServingPath.COMPLETIONS: (completion_job, CompletionRequest),
             ServingPath.CHAT_COMPLETIONS: (chat_job, ChatCompletionRequest)}


@dataclass
class KVOptions:
    """The worker's disaggregation settings (`frota worker --role ...`)."""

    role: EngineRole = EngineRole.BOTH
    advertise_url: str | None = None  # None: the router fills in the URL it reached us at
    handle_ttl_s: float = 30.0
    max_pinned_handles: int = 64


class KVMetrics:
    """`frota_kv_*` metrics, on the worker's registry."""

    def __init__(self, registry: Any, pinned: Any) -> None:
        self.bytes = Counter("frota_kv_transfer_bytes", "KV bytes moved between workers.",
                             ["direction"], registry=registry)
        self.seconds = Histogram("frota_kv_transfer_seconds", "Time to move one request's KV "
                                 "blocks (decode side: request to last byte copied).",
                                 ["direction"], buckets=TRANSFER_BUCKETS, registry=registry)
        self.handles = Counter("frota_kv_handles", "KV handles by how they ended: fetched, "
                               "expired (TTL), evicted (too many pinned), released.",
                               ["outcome"], registry=registry)
        self.failures = Counter("frota_kv_transfer_failures", "Decode-side imports that failed, "
                                "by reason.", ["reason"], registry=registry)
        self.recomputed = Counter("frota_kv_imports_recomputed", "Imports skipped because the "
                                  "decode pool was full; the prompt was recomputed.",
                                  registry=registry)
        gauge = Gauge("frota_kv_handles_pinned", "KV handles whose blocks are pinned now.",
                      registry=registry)
        gauge.set_function(pinned)


@dataclass
class _Pinned:
    seq: Any  # frota.engine.sequence.Sequence
    expires_at: float


class KVService:
    """Pinned handles, the reaper, and the HTTP client a decode worker pulls with."""

    def __init__(self, state: WorkerState, options: KVOptions) -> None:
        self.state = state
        self.options = options
        self.keyring: Keyring | None = state.options.keyring
        self.pinned: OrderedDict[str, _Pinned] = OrderedDict()
        self.metrics = KVMetrics(state.metrics.registry, lambda: len(self.pinned))
        self.session: aiohttp.ClientSession | None = None
        self._reaper: asyncio.Task[None] | None = None

    # -- engine access -------------------------------------------------------

    def kv(self) -> Any:
        """The engine's KV transfer side (`frota.engine.kv_transfer.KVTransfer`); 503 while
        loading."""
        bindings, _ = self.state.ready_generation()
        return bindings.engine.kv_transfer

    async def release(self, seq: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the engine is gone: nothing to free
            await self.kv().release(seq)

    # -- pinned handles ------------------------------------------------------

    def pin(self, seq: Any) -> None:
        while len(self.pinned) >= self.options.max_pinned_handles:
            _, oldest = self.pinned.popitem(last=False)
            self.metrics.handles.labels("evicted").inc()
            asyncio.get_running_loop().create_task(self.release(oldest.seq))
        self.pinned[seq.request_id] = _Pinned(seq, time.monotonic() + self.options.handle_ttl_s)

    async def expire(self) -> int:
        """Free every handle past its TTL; the number freed."""
        now = time.monotonic()
        expired = [k for k, p in self.pinned.items() if p.expires_at <= now]
        for key in expired:
            entry = self.pinned.pop(key)
            self.metrics.handles.labels("expired").inc()
            await self.release(entry.seq)
        if expired:
            log.info("freed %d expired KV handle(s)", len(expired))
        return len(expired)

    async def _reap(self) -> None:
        interval = max(0.05, min(1.0, self.options.handle_ttl_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire()
            except Exception:
                log.exception("expiring KV handles failed")

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=None, connect=5, sock_read=60))
        self._reaper = asyncio.create_task(self._reap())

    async def stop(self, app: web.Application) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self.session is not None:
            await self.session.close()

    # -- prefill side --------------------------------------------------------

    async def prefill(self, request: web.Request) -> web.Response:
        state = self.state
        bindings, generation = state.ready_generation()
        builder, model_cls = _BUILDERS[request.path.removeprefix(WorkerPath.KV_PREFILL)]
        body = await _read_json(request)
        try:
            req = model_cls.model_validate(body)
        except ValidationError as exc:
            raise errors.from_validation_error(exc) from exc
        job: Job = await builder(bindings, req, state.adapters)
        if job.num_choices != 1:
            raise errors.invalid("Disaggregated prefill serves one prompt and n=1.", param="n")
        generation.admit(1)
        engine = bindings.engine
        kv = engine.kv_transfer
        params = dataclasses.replace(job.params[0], max_tokens=1)
        request_id = f"kv-{uuid.uuid4().hex}"
        try:
            seq = kv.new_sequence(request_id, job.prompts[0], params, keep_kv=True,
                                  adapter=job.adapter)
        except InvalidRequestError as exc:
            raise errors.from_engine(exc) from exc
        except AdapterError as exc:  # unloaded since the request named it
            raise from_adapter_error(exc) from exc
        first: int | None = None
        reason: str | None = None
        with state.lifecycle.in_flight():
            try:
                async for out in engine.generate(request_id, seq.token_ids, params, seq=seq):
                    if out.new_token_ids:
                        first = int(out.new_token_ids[0])
                    reason = out.finish_reason if out.finished else reason
            finally:
                if first is None or reason not in ("stop", "length"):
                    await self.release(seq)
        if first is None or reason not in ("stop", "length"):
            raise errors.internal(f"The prefill ended without a first token ({reason}).")
        self.pin(seq)
        assert self.keyring is not None  # /internal/ routes answer only with a fleet key
        handle = self.keyring.sign({
            "url": self.options.advertise_url, "id": request_id,
            "fingerprint": kv.fingerprint(),
            "prompt_digest": kv.prompt_digest(job.prompts[0]),
            "num_prompt_tokens": seq.num_prompt_tokens, "first_token": first,
            "adapter": job.adapter, "expires_at": time.time() + self.options.handle_ttl_s,
        })
        return web.json_response({"kv_handle": handle, "first_token": first,
                                  "finish_reason": reason,
                                  "num_prompt_tokens": seq.num_prompt_tokens})

    async def send_blocks(self, request: web.Request) -> web.StreamResponse:
        kv = self.kv()
        fingerprint = kv.fingerprint()
        asked = request.headers.get(InternalHeader.KV_FINGERPRINT)
        if asked is not None and asked != fingerprint:
            log.warning("KV layout mismatch (request %s): this prefill worker has %s "
                        "(fingerprint %s), the decode worker %s", request_id(request),
                        kv.layout(), fingerprint, asked)
            raise _layout_mismatch()
        entry = self.pinned.pop(request.match_info["id"], None)
        if entry is None:
            raise errors.APIError(404, "Unknown or expired KV handle; run the request again.",
                                  type="not_found_error", code="kv_handle_not_found")
        seq = entry.seq
        fields, parts = kv.export(seq)
        header = json.dumps(fields).encode()
        started = time.perf_counter()
        sent = 0
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        try:
            await response.prepare(request)
            await response.write(struct.pack(">I", len(header)) + header)
            for data in parts:
                await response.write(data)
                sent += data.nbytes
            await response.write_eof()
            self.metrics.handles.labels("fetched").inc()
        finally:
            self.metrics.bytes.labels("sent").inc(sent)
            self.metrics.seconds.labels("send").observe(time.perf_counter() - started)
            await self.release(seq)
        return response

    async def drop_blocks(self, request: web.Request) -> web.Response:
        entry = self.pinned.pop(request.match_info["id"], None)
        if entry is not None:
            self.metrics.handles.labels("released").inc()
            await self.release(entry.seq)
        return web.json_response({"released": entry is not None})

    async def describe(self, request: web.Request) -> web.Response:
        kv = self.kv()
        return web.json_response({"role": self.options.role, "fingerprint": kv.fingerprint(),
                                  "layout": kv.layout(), "pinned_handles": len(self.pinned)})

    # -- decode side ---------------------------------------------------------

    def verified_handle(self, request: web.Request) -> dict[str, Any] | None:
        """The request's KV handle once its signature and expiry hold; None without one.
        Anything else is a 403, decided before anything is looked up or connected to."""
        raw = request.headers.get(InternalHeader.KV_HANDLE)
        if raw is None:
            return None
        if self.keyring is None:
            self.metrics.failures.labels("no_fleet_key").inc()
            raise forbidden("KV handles are not accepted here: this worker has no fleet key.",
                            code="kv_handle_refused")
        try:
            handle = json.loads(raw)
        except ValueError:
            handle = None
        if not isinstance(handle, dict) or not self.keyring.verify(handle):
            self.metrics.failures.labels("bad_signature").inc()
            log.warning("refused a KV handle whose signature does not hold (request %s)",
                        request_id(request))
            raise forbidden("The KV handle is not valid.", code="kv_handle_invalid")
        expires_at = handle.get("expires_at")
        if not isinstance(expires_at, int | float) or expires_at < time.time():
            self.metrics.failures.labels("expired").inc()
            raise forbidden("The KV handle has expired.", code="kv_handle_expired")
        return handle

    @web.middleware
    async def check_handle(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A request that carries a KV handle has it checked first, before its body is read."""
        handle = self.verified_handle(request)
        if handle is not None:
            request[HANDLE_KEY] = handle
        return await handler(request)

    async def import_kv(self, request: web.Request, job: Job) -> None:
        """The `WorkerState.kv_import` hook: pull the handle's blocks, set `job.kv_seq`."""
        handle = request.get(HANDLE_KEY)
        if handle is None:
            return
        try:  # signed by the fleet, so well formed unless a peer runs other code
            url, handle_id = str(handle["url"]).rstrip("/"), str(handle["id"])
            first = int(handle["first_token"])
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.invalid("The KV handle is incomplete.",
                                 param=InternalHeader.KV_HANDLE) from exc
        if job.num_choices != 1:
            raise errors.invalid("A request with a KV handle must have one prompt and n=1.",
                                 param="n")
        kv = self.kv()
        fingerprint = kv.fingerprint()
        if handle.get("fingerprint") != fingerprint:
            self.metrics.failures.labels("layout_mismatch").inc()
            log.warning("KV layout mismatch (request %s): the handle's fingerprint is %s, this "
                        "decode worker's %s (%s)", request_id(request), handle.get("fingerprint"),
                        fingerprint, kv.layout())
            raise _layout_mismatch()
        prompt = job.prompts[0]
        if handle.get("prompt_digest") != kv.prompt_digest(prompt):
            self.metrics.failures.labels("prompt_mismatch").inc()
            raise errors.APIError(409, "The KV handle belongs to a different prompt (the prefill "
                                  "worker tokenized it differently).", code="kv_prompt_mismatch")
        if handle.get("adapter") != job.adapter:
            self.metrics.failures.labels("adapter_mismatch").inc()
            raise _adapter_mismatch(handle.get("adapter"), job.adapter)
        try:
            seq = kv.new_sequence(job.engine_id(0), prompt, job.params[0], adapter=job.adapter)
        except Exception as exc:
            raise errors.invalid(str(exc)) from exc
        started = time.perf_counter()
        try:
            received = await self._pull(kv, seq, url, handle_id, fingerprint, request)
        except errors.APIError:
            if kv.holds_blocks(seq):
                await self.release(seq)
            raise
        except (aiohttp.ClientError, asyncio.IncompleteReadError, OSError, TimeoutError,
                ValueError, KeyError, TypeError) as exc:
            if kv.holds_blocks(seq):
                await self.release(seq)
            self.metrics.failures.labels(type(exc).__name__).inc()
            log.warning("could not fetch KV handle %s from %s (request %s): %r", handle_id, url,
                        request_id(request), exc)
            raise _transfer_failed() from exc
        self.metrics.bytes.labels("received").inc(received)
        self.metrics.seconds.labels("receive").observe(time.perf_counter() - started)
        kv.finish_import(seq, first)
        job.kv_seq = seq

    async def _pull(self, kv: Any, seq: Any, url: str, handle_id: str, fingerprint: str,
                    request: web.Request) -> int:
        """Stream the blocks into `seq`'s newly reserved blocks; the bytes received (0 when the
        pool was full and the prompt will be recomputed instead)."""
        assert self.session is not None and self.keyring is not None
        headers = dict([self.keyring.authorization(), (InternalHeader.KV_FINGERPRINT, fingerprint),
                        (InternalHeader.REQUEST_ID, request_id(request))])
        async with self.session.get(f"{url}{WorkerPath.KV_BLOCKS}/{handle_id}",
                                    headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:500]
                self.metrics.failures.labels(f"status_{resp.status}").inc()
                log.warning("the prefill worker %s answered %d for KV handle %s (request %s): "
                            "%s", url, resp.status, handle_id, request_id(request), text)
                raise _layout_mismatch() if resp.status == 409 else _transfer_failed()
            (size,) = struct.unpack(">I", await resp.content.readexactly(4))
            header = json.loads(await resp.content.readexactly(size))
            num_parts = kv.num_parts()
            if (header["fingerprint"] != fingerprint or len(header["parts"]) != num_parts
                    or header["num_prompt_tokens"] != seq.num_prompt_tokens):
                log.warning("the KV stream of handle %s does not fit this worker (request %s): "
                            "%s", handle_id, request_id(request), header)
                raise _layout_mismatch()
            try:
                kv.check_adapter(header, seq)
            except AdapterError as exc:
                self.metrics.failures.labels("adapter_mismatch").inc()
                raise errors.APIError(409, f"The KV stream does not fit this request: {exc}.",
                                      code="kv_adapter_mismatch") from exc
            if not await kv.reserve(seq):
                self.metrics.recomputed.inc()
                return 0  # closing the stream early frees the blocks on the prefill side
            received = 0
            for i, spec in enumerate(header["parts"]):
                data = await resp.content.readexactly(spec["nbytes"])
                kv.import_part(seq, i, data, spec)
                received += len(data)
            return received


def _layout_mismatch() -> errors.APIError:
    return errors.APIError(409, "The KV handle was computed for another KV layout; prefill and "
                           "decode workers must run the same model, dtype and block size.",
                           code="kv_layout_mismatch")


def _transfer_failed() -> errors.APIError:
    return errors.APIError(424, "Could not fetch the KV blocks from the prefill worker; retry "
                           "the request (colocated).", type="upstream_error",
                           code="kv_transfer_failed")


def _adapter_mismatch(sent: object, wanted: str | None) -> errors.APIError:
    def name(adapter: object) -> str:
        return "the base model" if adapter is None else f"adapter {adapter!r}"

    return errors.APIError(409, f"The KV handle was computed under {name(sent)}, but this "
                           f"request runs under {name(wanted)}; KV of one adapter never serves "
                           "another. Run the request colocated.", param="model",
                           code="kv_adapter_mismatch")


KV_KEY: web.AppKey[KVService] = web.AppKey("kv", KVService)


def add_kv_routes(app: web.Application, options: KVOptions) -> KVService:
    """Enable `options.role` on a worker app (from `create_app`)."""
    if options.role not in tuple(EngineRole):
        raise ValueError(f"role {options.role!r}: use one of {', '.join(EngineRole)}")
    state = app[STATE_KEY]
    if options.role != EngineRole.BOTH and state.options.keyring is None:
        raise ValueError(f"role {options.role!r} needs the fleet key (--fleet-key-file): KV "
                         "handles are signed with it")
    service = KVService(state, options)
    app[KV_KEY] = service
    app.middlewares.append(service.check_handle)
    app.on_startup.append(service.start)
    app.on_cleanup.append(service.stop)
    app.router.add_get(WorkerPath.KV_LAYOUT, service.describe)
    if options.role in (EngineRole.PREFILL, EngineRole.BOTH):
        for path in _BUILDERS:  # the OpenAI path under KV_PREFILL
            app.router.add_post(WorkerPath.KV_PREFILL + path, service.prefill)
        app.router.add_get(WorkerPath.KV_BLOCKS + "/{id}", service.send_blocks)
        app.router.add_delete(WorkerPath.KV_BLOCKS + "/{id}", service.drop_blocks)
    if options.role in (EngineRole.DECODE, EngineRole.BOTH):
        state.kv_import = service.import_kv
    return app[KV_KEY]
