"""`frota worker`: serve one model over the OpenAI API (rank 0 of a worker pod).

Every flag can also come from the environment, `FROTA_` + the flag in upper
case with dashes as underscores (`--max-num-seqs` <- `FROTA_MAX_NUM_SEQS`);
a flag on the command line wins. torch and the engine load only inside `run`.

LoRA takes vLLM's flags, so the operator's arguments for either runtime read alike:
`--enable-lora`, `--max-loras N` (default 4), `--max-lora-rank R` (default 16),
`--lora-modules name=path ...` (or vLLM's JSON form `{"name": ..., "path": ...}` per item;
loaded at start, a bad one fails the start naming it), and runtime loading
(`/v1/load_lora_adapter`) with `--allow-runtime-lora` or vLLM's environment variable
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=true`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from frota.api.contract import HTTP_PORT, EngineRole, Env, ModelAlias
from frota.api.memory import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS

ENGINE_FLAGS = ("model", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                "block_size", "num_kv_blocks", "kv_cache_memory", "enable_prefix_caching",
                "seed", "quantization", "kv_cache_dtype", "tensor_parallel_size",
                "pipeline_parallel_size", "expert_parallel_size", "expert_capacity_factor")

_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
               "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """Bytes from `1073741824`, `4G`, `512MiB`, `1.5GB`."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?)?b?\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4GiB or 512MB)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2) or ""])


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


DEFAULT_MAX_LORAS = 4


def parse_lora_module(text: str) -> tuple[str, str]:
    """(name, path) from `name=path` or vLLM's `{"name": ..., "path": ...}`."""
    if text.lstrip().startswith("{"):
        try:
            item = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON object: {text!r} ({exc})") from exc
        name, path = item.get("name"), item.get("path")
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise argparse.ArgumentTypeError(f"{text!r}: the object needs string \"name\" and "
                                             "\"path\"")
        return name, path
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=path (or a JSON object with "
                                         "name and path)")
    return name, path


def env_name(flag: str) -> str:
    return "FROTA_" + flag.lstrip("-").upper().replace("-", "_")


def _flag(parser: argparse.ArgumentParser, flag: str, *, type: Callable[[str], Any] = str,
          default: Any = None, help: str, required: bool = False, **kw: Any) -> None:
    """Add `flag`, whose default comes from its FROTA_* environment variable when set."""
    env = env_name(flag)
    raw = os.environ.get(env)
    if raw is not None and raw != "":
        try:
            default = type(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise SystemExit(f"frota worker: bad {env}={raw!r}: {exc}") from exc
        required = False
    parser.add_argument(flag, type=type, default=default, required=required,
                        help=f"{help} [env {env}]", **kw)


def _switch(parser: argparse.ArgumentParser, flag: str, *, help: str) -> None:
    """A bare on-switch (vLLM's style), also on when its FROTA_* variable is true."""
    env = env_name(flag)
    raw = os.environ.get(env)
    try:
        default = parse_bool(raw) if raw else False
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"frota worker: bad {env}={raw!r}: {exc}") from exc
    parser.add_argument(flag, action="store_true", default=default, help=f"{help} [env {env}]")


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    _switch(parser, "--enable-lora", help="serve LoRA adapters: a request's `model` names one")
    _flag(parser, "--max-loras", type=int,
          help=f"adapters resident at once (slots), default {DEFAULT_MAX_LORAS} with --enable-lora")
    _flag(parser, "--max-lora-rank", type=int, default=16, help="the highest adapter rank")
    env = env_name("--lora-modules")
    raw = os.environ.get(env)
    try:
        default = [parse_lora_module(item) for item in raw.split()] if raw else None
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"frota worker: bad {env}={raw!r}: {exc}") from exc
    parser.add_argument("--lora-modules", nargs="+", type=parse_lora_module, default=default,
                        metavar="NAME=PATH",
                        help="adapters (PEFT directories) to load at start, each name=path or "
                        f'{{"name": ..., "path": ...}} [env {env}, space-separated]')
    _switch(parser, "--allow-runtime-lora",
            help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
            f"(also on with {Env.RUNTIME_LORA}=true)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _flag(parser, "--model", required=True,
          help=f"model: alias ({ModelAlias.SMOLLM2}), path to .gguf, HF directory, or "
          "synthetic:...")
    _flag(parser, "--served-model-name", help="name clients use in `model` (default: --model)")
    _flag(parser, "--host", default="0.0.0.0", help="address to listen on")
    _flag(parser, "--port", type=int, default=HTTP_PORT, help="port to listen on")
    _flag(parser, "--dtype", choices=DTYPES,
          help="weight and activation dtype (default: the engine's)")
    _flag(parser, "--max-model-len", type=int, help="context length (default: the model's)")
    _flag(parser, "--max-num-seqs", type=int, help="most sequences in a batch")
    _flag(parser, "--max-num-batched-tokens", type=int, help="most tokens in one engine step")
    _flag(parser, "--block-size", type=int, help="tokens per KV-cache block")
    _flag(parser, "--num-kv-blocks", type=int, help="KV-cache blocks (overrides memory sizing)")
    _flag(parser, "--kv-cache-memory", type=parse_size,
          help="KV-cache size in bytes, e.g. 2GiB (default: a fraction of free memory)")
    _flag(parser, "--enable-prefix-caching", type=parse_bool,
          help="reuse KV blocks of shared prompt prefixes (true/false)")
    _flag(parser, "--seed", type=int, help="engine seed for unseeded requests")
    _flag(parser, "--quantization", choices=QUANTIZATIONS,
          help="weight quantization; a GGUF's Q4_0/Q4_1/Q8_0 tensors are kept as they are "
          "(default: none)")
    _flag(parser, "--kv-cache-dtype", choices=KV_CACHE_DTYPES,
          help="KV-cache storage: auto (the model dtype), int8 or fp8 (about half of bfloat16)")
    _flag(parser, "--max-queue", type=int, default=256,
          help="most requests waiting for their first token; beyond it 429 (0: unbounded)")
    _flag(parser, "--shutdown-grace-period", type=float, default=30.0,
          help="seconds in-flight requests get to finish after SIGTERM")
    _flag(parser, "--role", choices=[role.value for role in EngineRole],
          default=EngineRole.BOTH.value,
          help="disaggregation role: prefill (runs prompts, keeps their KV for a decode worker "
          "to pull), decode (continues requests from a KV handle), both (either, and whole "
          "requests)")
    _flag(parser, "--advertise-url",
          help="URL decode workers use to pull KV from this worker (default: the URL the "
          "router reached it at)")
    _flag(parser, "--kv-handle-ttl", type=float, default=30.0,
          help="seconds a prefill keeps unfetched KV blocks pinned before freeing them")
    _flag(parser, "--kv-max-pinned-handles", type=int, default=64,
          help="most prefills whose KV is pinned at once; beyond it the oldest is freed")
    _flag(parser, "--tensor-parallel-size", type=int,
          help="ranks each layer's matrices are split over, default 1 (rank from FROTA_RANK; without "
          "FROTA_WORLD_SIZE, local ranks are spawned on ports --port + rank)")
    _flag(parser, "--pipeline-parallel-size", type=int,
          help="contiguous layer stages, default 1 (world = tensor x pipeline ranks)")
    _flag(parser, "--expert-parallel-size", type=int,
          help="MoE: expert groups inside the tensor-parallel ranks (divides tensor), default 1")
    _flag(parser, "--expert-capacity-factor", type=float,
          help="MoE: most (token, slot) pairs per expert per step, as a multiple of the even "
          "share; overflow pairs are dropped (default: no limit)")
    _flag(parser, "--fleet-key-file",
          help="the fleet's key (a Secret the operator mounts; `frota up` writes one): internal "
          "endpoints then ask for its credential and KV handles for its signature. Without it "
          "the worker stands alone: /internal/ answers 403 and --role prefill/decode are refused")
    _flag(parser, "--api-key", help="require `Authorization: Bearer <key>` on every /v1/ route "
          "(default: no key)")
    add_lora_arguments(parser)
    _flag(parser, "--log-level", default="info", help="debug, info, warning, error")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineArgs keywords: only the flags that were set, so engine defaults apply."""
    kwargs = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
    if getattr(args, "enable_lora", False):
        kwargs["max_loras"] = args.max_loras if args.max_loras is not None else DEFAULT_MAX_LORAS
        kwargs["max_lora_rank"] = args.max_lora_rank
    return kwargs


def runtime_lora_allowed(args: argparse.Namespace) -> bool:
    raw = os.environ.get(Env.RUNTIME_LORA, "")
    return bool(args.allow_runtime_lora) or raw.strip().lower() in {"1", "true"}


def lora_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The server's LoRAOptions (None: LoRA off); SystemExit for LoRA flags without LoRA."""
    from frota.server.adapters import LoRAOptions

    if not args.enable_lora:
        if args.lora_modules or args.max_loras is not None:
            raise SystemExit("frota worker: --lora-modules and --max-loras need --enable-lora")
        return None
    if (args.max_loras is not None and args.max_loras < 1) or args.max_lora_rank < 1:
        raise SystemExit("frota worker: --max-loras and --max-lora-rank must be at least 1")
    return LoRAOptions(modules=tuple(args.lora_modules or ()),
                       runtime_loading=runtime_lora_allowed(args))


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a daemon thread: a SIGTERM during a model load must not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def target() -> None:
        try:
            result = fn()
        except BaseException as exc:
            error = exc
            loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(error))
        else:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    threading.Thread(target=target, name="frota-engine-load", daemon=True).start()
    return await future


def run(args: argparse.Namespace) -> int:
    """Serve `--model` until SIGTERM; exit 0 after a graceful drain."""
    from frota.server import logs, ranks
    from frota.server.app import ServerOptions, create_app
    from frota.server.engine_api import EngineBindings
    from frota.server.kv_routes import KVOptions, add_kv_routes
    from frota.server.lifecycle import serve

    logs.setup(args.log_level)
    lora = lora_options(args)
    children: list = []
    if ranks.world_size(args) > 1:
        if args.role != EngineRole.BOTH:
            raise SystemExit("frota worker: --role prefill/decode is not supported with tensor or "
                             "pipeline parallelism yet; use --role both")
        if not (os.environ.get(Env.WORLD_SIZE) or os.environ.get(Env.TORCH_WORLD_SIZE)):
            children = ranks.spawn_local_followers(args)
        elif ranks.rank_from_env() != 0:
            return ranks.run_follower(args, engine_kwargs(args))

    def build() -> EngineBindings:
        # Importing torch takes seconds: keep it off the event loop too.
        from frota.engine import AsyncEngine, EngineArgs

        engine = AsyncEngine(EngineArgs(**engine_kwargs(args)))
        return EngineBindings(engine, constrained_decoding=True)

    async def load() -> EngineBindings:
        bindings = await _in_daemon_thread(build)
        await bindings.engine.start()
        return bindings

    keyring = None
    if args.fleet_key_file:
        from frota.api.fleet_key import FleetKeyError, Keyring

        try:  # a rotated key is still accepted for one handle TTL
            keyring = Keyring.from_file(args.fleet_key_file, grace_s=args.kv_handle_ttl)
        except FleetKeyError as exc:
            raise SystemExit(f"frota worker: {exc}") from exc
    if args.role != EngineRole.BOTH and keyring is None:
        raise SystemExit(f"frota worker: --role {args.role} needs --fleet-key-file (the fleet's "
                         "key signs the KV handles prefill and decode workers exchange)")
    options = ServerOptions(
        served_model_name=args.served_model_name or args.model,
        max_queue=args.max_queue or None,
        shutdown_grace_period_s=args.shutdown_grace_period,
        lora=lora,
        api_key=args.api_key or None,
        keyring=keyring,
    )

    async def main() -> int:
        app = create_app(options, load)
        add_kv_routes(app, KVOptions(args.role, args.advertise_url, args.kv_handle_ttl,
                                     args.kv_max_pinned_handles))
        from frota.server.app import STATE_KEY

        state = app[STATE_KEY]
        is_group = ranks.world_size(args) > 1
        watch = asyncio.ensure_future(ranks.watch_group(state)) if is_group else None
        code = await serve(app, state.lifecycle, args.host, args.port,
                           options.shutdown_grace_period_s, state.abort_all)
        if watch is not None:
            watch.cancel()
            ranks.stop_followers(state)
            ranks.exit_now(code, children)
        return code

    return asyncio.run(main())
