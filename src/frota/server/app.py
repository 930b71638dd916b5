"""The aiohttp application: OpenAI routes, health/readiness/metrics, engine start-up.

`create_app(options, load)` opens for business at once; the engine loads in
the background (`load` returns `EngineBindings`), so `/health` answers while
`/ready` and the generation routes answer 503 until the model is loaded and
warmed up. Later roles (prefill/decode, `/internal/kv/...`) add route groups
beside `add_openai_routes`. With LoRA (`ServerOptions.lora`) the `--lora-modules` adapters
load before the worker turns ready, `model` may name an adapter, and runtime loading adds
vLLM's load/unload routes (`frota.server.adapters`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from pydantic import ValidationError

from frota.api.contract import ServingPath, WorkerPath
from frota.api.fleet_key import Keyring
from frota.api.openai_requests import ChatCompletionRequest, CompletionRequest
from frota.engine.outputs import EngineStats
from frota.engine.sampling_params import SamplingParams
from frota.server import adapters, errors, fleet_auth
from frota.server.adapters import AdapterRegistry, LoRAOptions, StartupAdapterError
from frota.server.engine_api import EngineBindings
from frota.server.generation import Generation, Job
from frota.server.jobs import chat_job, completion_job
from frota.server.lifecycle import Lifecycle, Phase
from frota.server.metrics import CONTENT_TYPE, ServerMetrics
from frota.server.streaming import EventStream

log = logging.getLogger("frota.server")

MAX_BODY_BYTES = 32 * 1024 * 1024

Loader = Callable[[], Awaitable[EngineBindings]]


@dataclass
class ServerOptions:
    """Server settings that are not engine arguments."""

    served_model_name: str
    max_queue: int | None = 256
    shutdown_grace_period_s: float = 30.0
    warmup: bool = True
    lora: LoRAOptions | None = None  # None: LoRA off (no adapter routes, no LoRA metric)
    # Set: every /v1/ route asks for `Authorization: Bearer <api_key>` (vLLM's --api-key).
    api_key: str | None = None
    # The fleet key (`--fleet-key-file`): internal endpoints ask for its credential and KV
    # handles must carry its signature. None: a worker on its own, whose internal
    # endpoints are closed (frota.server.fleet_auth).
    keyring: Keyring | None = None


class WorkerState:
    """Everything a handler needs; one per app (no module globals)."""

    def __init__(self, options: ServerOptions, load: Loader) -> None:
        self.options = options
        self.load = load
        self.lifecycle = Lifecycle()
        self.bindings: EngineBindings | None = None
        self.generation: Generation | None = None
        self.metrics = ServerMetrics(options.served_model_name, self.stats)
        self.created = int(time.time())
        self.adapters = AdapterRegistry(options.served_model_name)
        # Decode role: turns a request's KV handle header into `job.kv_seq` (kv_routes).
        self.kv_import: Callable[[web.Request, Job], Awaitable[None]] | None = None

    def stats(self) -> EngineStats | None:
        if self.bindings is None:
            return None
        return self.bindings.engine.stats()

    def engine_alive(self) -> bool:
        """False once a loaded engine's step loop has died (the pod should restart)."""
        if self.bindings is None:
            return True
        return self.bindings.engine.is_running

    def abort_all(self) -> None:
        if self.generation is not None:
            self.generation.abort_all()

    def ready_generation(self) -> tuple[EngineBindings, Generation]:
        phase = self.lifecycle.phase
        if phase is not Phase.READY or self.bindings is None or self.generation is None:
            self.metrics.observe_rejected(503)
            what = "is still loading" if phase is Phase.LOADING else f"is {phase.value}"
            raise errors.unavailable(f"The model {what}; retry shortly or on another worker.")
        return self.bindings, self.generation


STATE_KEY: web.AppKey[WorkerState] = web.AppKey("state", WorkerState)


async def _start_engine(app: web.Application) -> None:
    state = app[STATE_KEY]
    t0 = time.monotonic()
    log.info("loading model %s", state.options.served_model_name)
    try:
        state.bindings = await state.load()
        generation = Generation(state.bindings, state.metrics, state.options.max_queue)
        if state.options.lora is not None:
            await state.adapters.load_modules(state.bindings.engine, state.options.lora.modules)
        loaded = time.monotonic()
        if state.options.warmup:
            await _warm_up(state.bindings)
    except asyncio.CancelledError:
        raise
    except StartupAdapterError as exc:
        log.error("%s", exc)
        state.lifecycle.fail()
        return
    except Exception:
        log.exception("the engine failed to load")
        state.lifecycle.fail()
        return
    state.generation = generation
    # Start-up's phases, for cold-start breakdowns (e2e/test_scale_to_zero.py reads them).
    log.info("model loaded and warmed up",
             extra={"fields": {"load_s": round(loaded - t0, 3),
                               "warmup_s": round(time.monotonic() - loaded, 3),
                               "max_model_len": state.bindings.engine.max_model_len}})
    if state.lifecycle.phase is Phase.LOADING:
        state.lifecycle.set_phase(Phase.READY)


async def _warm_up(bindings: EngineBindings) -> None:
    """One tiny request, so the first real request does not pay for lazy initialisation."""
    engine = bindings.engine
    params = SamplingParams(max_tokens=2, temperature=0.0)
    async for _ in engine.generate("warmup", engine.tokenizer.encode("Hello"), params):
        pass


async def _on_startup(app: web.Application) -> None:
    app[LOAD_TASK_KEY] = asyncio.create_task(_start_engine(app))


async def _on_cleanup(app: web.Application) -> None:
    task = app[LOAD_TASK_KEY]
    if not task.done():
        task.cancel()
    bindings = app[STATE_KEY].bindings
    if bindings is not None:
        try:
            await bindings.engine.shutdown()
        except Exception:
            log.exception("engine shutdown failed")


LOAD_TASK_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("load_task", asyncio.Task)


def auth_middleware(api_key: str):  # type: ignore[no-untyped-def]
    """401 for a /v1/ request without `Authorization: Bearer <api_key>`, as vLLM's --api-key
    (an internal call that carried the fleet's credential has shown more than a key)."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path.startswith("/v1/") and not request.get(fleet_auth.FROM_FLEET):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                message = ("Missing API key: send 'Authorization: Bearer <key>'."
                           if not given else "Incorrect API key provided.")
                raise errors.APIError(401, message, code="invalid_api_key")
        return await handler(request)

    return check


@web.middleware
async def error_middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Every error leaves as OpenAI-shaped JSON; nothing escapes as a bare 500."""
    try:
        return await handler(request)
    except errors.APIError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        typ = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return errors.APIError(exc.status, exc.reason or "error", type=typ).response()
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s (request %s)", request.method, request.path,
                      fleet_auth.request_id(request))
        return errors.internal("Internal server error.").response()


async def _read_json(request: web.Request) -> dict:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise errors.APIError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.",
                              param="body", code="request_too_large") from exc
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.from_json_error(exc) from exc
    except RecursionError as exc:
        raise errors.invalid("The request body is nested too deeply.", param="body") from exc
    if not isinstance(body, dict):
        raise errors.invalid("The request body must be a JSON object.", param="body")
    return body


async def _generate(request: web.Request, job_builder, model_cls) -> web.StreamResponse:  # type: ignore[no-untyped-def]
    state = request.app[STATE_KEY]
    bindings, generation = state.ready_generation()
    body = await _read_json(request)
    try:
        req = model_cls.model_validate(body)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from exc
    except RecursionError as exc:
        raise errors.invalid("The request body is nested too deeply.", param="body") from exc
    job: Job = await job_builder(bindings, req, state.adapters)
    generation.admit(job.num_choices)
    if state.kv_import is not None:
        await state.kv_import(request, job)
    with state.lifecycle.in_flight():
        if not req.stream:
            return web.json_response(await generation.run(job, None))
        stream = EventStream(request)
        try:
            await generation.run(job, stream.start)
        except errors.APIError as exc:
            if not stream.started:
                raise
            return await stream.finish(exc.body())
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("stream %s failed", job.request_id)
            if not stream.started:
                raise
            return await stream.finish(errors.internal("Internal server error.").body())
        return await stream.finish()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, completion_job, CompletionRequest)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat_job, ChatCompletionRequest)


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    card = {"id": state.options.served_model_name, "object": "model", "created": state.created,
            "owned_by": "frota"}
    max_model_len = None
    if state.bindings is not None:
        max_model_len = card["max_model_len"] = state.bindings.engine.max_model_len
    cards = [card, *state.adapters.model_cards(max_model_len)]
    return web.json_response({"object": "list", "data": cards})


async def load_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    bindings, _ = state.ready_generation()
    text = await adapters.load_from_body(state.adapters, bindings.engine, await _read_json(request))
    return web.Response(text=text)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    bindings, _ = state.ready_generation()
    text = await adapters.unload_from_body(state.adapters, bindings.engine,
                                           await _read_json(request))
    return web.Response(text=text)


async def health(request: web.Request) -> web.Response:
    """Liveness: the process answers and, once loaded, the engine loop is alive."""
    if not request.app[STATE_KEY].engine_alive():
        return web.json_response({"status": "engine stopped"}, status=503)
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    phase = state.lifecycle.phase
    is_ready = phase is Phase.READY and state.engine_alive()
    return web.json_response({"status": phase.value if state.engine_alive() else "failed"},
                             status=200 if is_ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post(ServingPath.COMPLETIONS, completions)
    app.router.add_post(ServingPath.CHAT_COMPLETIONS, chat_completions)
    app.router.add_get(ServingPath.MODELS, models)


def add_adapter_routes(app: web.Application) -> None:
    """vLLM's runtime LoRA loading; only with runtime loading on (else 404, as vLLM)."""
    app.router.add_post(WorkerPath.LOAD_LORA_ADAPTER, load_lora_adapter)
    app.router.add_post(WorkerPath.UNLOAD_LORA_ADAPTER, unload_lora_adapter)


def add_ops_routes(app: web.Application) -> None:
    app.router.add_get(ServingPath.HEALTH, health)
    app.router.add_get(ServingPath.READY, ready)
    app.router.add_get(ServingPath.METRICS, metrics)


def create_app(options: ServerOptions, load: Loader | EngineBindings) -> web.Application:
    """The worker app; `load` is an async loader or an already started engine's bindings."""
    if isinstance(load, EngineBindings):
        bindings = load

        async def loaded() -> EngineBindings:
            return bindings

        load = loaded
    middlewares = [error_middleware, fleet_auth.middleware(options.keyring)]
    if options.api_key:
        middlewares.append(auth_middleware(options.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = WorkerState(options, load)
    add_ops_routes(app)
    add_openai_routes(app)
    if options.lora is not None and options.lora.runtime_loading:
        add_adapter_routes(app)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app
