"""`frota router`: route OpenAI requests across workers.

Every flag can also come from the environment: `--max-inflight` reads
`FROTA_MAX_INFLIGHT`, and so on (`FROTA_` + the flag in upper case, dashes as
underscores). A flag on the command line wins; a switch's variable is true when it
is `1`, `true`, `yes` or `on`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frota.api.contract import HTTP_PORT, AdmissionDefault, Env, Label
from frota.router.policies import LoadSignal, PolicyName, PrefixAwareConfig
from frota.router.server import KEEPALIVE_TIMEOUT, MAX_CONNECTIONS, WRITE_TIMEOUT, Limits

if TYPE_CHECKING:
    from frota.router.app import RouterApp


def _env_name(flag: str) -> str:
    return "FROTA_" + flag.lstrip("-").upper().replace("-", "_")


def _flag_adder(group: argparse._ArgumentGroup) -> Callable[..., None]:
    """`add(flag, default, help, **kwargs)` for `group`: the default comes from the flag's
    environment variable when it is set, the help names that variable, and a number default
    makes the flag parse as that type (argparse converts an environment string with it)."""

    def add(flag: str, default: Any = None, help: str | None = None,
            env_also: str | None = None, **kwargs: Any) -> None:
        env = _env_name(flag)
        names = f"{env}, or {env_also}" if env_also else env
        if env_also:  # an older name, read only when the flag's own variable is unset
            default = os.environ.get(env_also) or default
        if isinstance(default, int | float) and not isinstance(default, bool):
            kwargs.setdefault("type", type(default))
        group.add_argument(flag, default=os.environ.get(env, default),
                           help=f"{help} [env {names}]" if help else f"[env {names}]",
                           **kwargs)

    return add


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = _flag_adder(parser.add_argument_group("serving"))
    add("--host", "0.0.0.0", "address to listen on")
    add("--port", HTTP_PORT, "port to listen on")
    add("--api-key-file", None, "file with accepted API keys, one per line; without it, no auth")
    add("--fleet-key-file", None, "the fleet's key (the operator mounts its Secret; `frota up` "
        "writes one): internal calls to workers carry its credential; disaggregation needs it")
    add("--debug-headers", False, "name the worker that served each answer (x-frota-worker) and "
        "serve /router/workers to anyone: worker addresses are internal, so keep this off for "
        "clients you do not trust", action="store_true")
    add("--validate-requests", False, "check completions and chat bodies against Frota's "
        "OpenAI request models before routing, so workers of another runtime (vLLM) refuse "
        "the same requests with the same 400", action="store_true")
    add("--log-level", "info", type=str.lower, choices=["debug", "info", "warning", "error"])
    add("--drain-timeout", 30.0, "on SIGTERM, seconds requests in flight may run on before "
        "they are cut off (new connections are refused at once)")
    add("--processes", 1, "router processes sharing --port (SO_REUSEPORT), each with its "
        "share of --max-inflight and --max-queue; a supervisor forwards SIGTERM to each and "
        "restarts one that dies after serving a while")
    add("--max-connections", MAX_CONNECTIONS, "client connections one router process holds "
        "at once; one more is answered 503 with Retry-After and closed")
    add("--keepalive-timeout", KEEPALIVE_TIMEOUT, "seconds an idle kept-alive connection "
        "stays open, and the most a request's head and body may take to arrive")
    add("--write-timeout", WRITE_TIMEOUT, "seconds a client may take none of its answer "
        "before its connection is cut (a stalled reader; its request is cancelled)")

    add = _flag_adder(parser.add_argument_group("discovery"))
    add("--discovery", "static", "where the workers come from", choices=["static", "kubernetes"])
    add("--workers", None, "static discovery: worker base URLs, comma separated")
    add("--namespace", None, "kubernetes: namespace of the workers (default: the pod's own)")
    add("--selector", None, "kubernetes: label selector of the workers' EndpointSlices")
    add("--kubeconfig", None, "kubernetes: kubeconfig path (default: in-cluster service account)")
    add("--port-name", None,
        "kubernetes: EndpointSlice port name to use (default: the first port)")

    add = _flag_adder(parser.add_argument_group("disaggregated prefill/decode"))
    add("--prefill-workers", None, "static discovery: prefill worker URLs (`frota worker --role "
        "prefill`); with them, long prompts run prefill there and decode on the main pool")
    add("--decode-workers", None,
        "static discovery: decode worker URLs (join --workers in the main pool)")
    add("--disagg-min-prompt-tokens", None, "shortest prompt (estimated as characters / 4) "
        "worth moving KV for; shorter ones stay colocated on the main pool (default 256); "
        "with --discovery kubernetes, setting it turns disaggregation on (prefill pods by "
        "frota.dev/role)", env_also=Env.MIN_PREFILL_TOKENS, type=int)

    prefix = PrefixAwareConfig()  # the prefix-aware defaults
    add = _flag_adder(parser.add_argument_group("routing"))
    add("--policy", PolicyName.ROUND_ROBIN.value, "how a replica is chosen",
        choices=[p.value for p in PolicyName])
    add("--load-signal", LoadSignal.OUTSTANDING.value,
        "least-load: router-side outstanding requests or the workers' /metrics",
        choices=[s.value for s in LoadSignal])
    add("--prefix-block-chars", prefix.block_chars,
        "prefix-aware: characters per hashed prompt block")
    add("--prefix-max-blocks", prefix.max_blocks, "prefix-aware: leading blocks hashed per prompt")
    add("--prefix-balance", prefix.balance,
        "prefix-aware: a worker may take (1 + this) x its fair share of load")
    add("--prefix-balance-abs", prefix.balance_abs, "prefix-aware: ... or this many requests "
        "more than the least loaded worker, whichever allows more (low load)")
    add("--prefix-hot-window", prefix.hot_window, "prefix-aware: a prefix behind more of this "
        "many latest requests than one worker may take under the load bound is hot: requests "
        "under it are placed by their longer prefix over the workers its share needs (0: no "
        "prefix is ever hot)")
    add("--session-header", "x-session-id",
        "session: header carrying the session key (else the body's `user`)")

    add = _flag_adder(parser.add_argument_group("LoRA adapters"))
    add("--lora-runtime-loading", False, "serve /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter (fanned out to every worker, replayed to workers that "
        "join later), and load an adapter no worker holds onto the least loaded one when "
        "a request names it", env_also=Env.RUNTIME_LORA,
        action="store_true")
    add("--adapters", None, "NAME=PATH,...: adapters the router may load on demand (paths "
        "as the workers see them; the workers load these at start)")
    add("--adapter-load-timeout", 60.0, "seconds a worker may take to load an adapter")
    add("--adapter-refresh", 10.0, "seconds between reads of a LoRA worker's /v1/models "
        "when its metrics show no change")

    add = _flag_adder(parser.add_argument_group("scale to zero"))
    add("--hold-seconds", 0.0, "hold a request that finds no ready worker this long (a "
        "replica may be starting from zero) before a 503; 0: answer 503 at once")
    add("--max-held-requests", 1024, "requests held at once; beyond it 503 at once")
    add("--announce-demand", None, "kubernetes: when a request is held, stamp the demand "
        "ConfigMap of this name (in --namespace; the operator makes it) so the operator "
        "brings a replica back at once")
    add("--demand-url", None, "when a request is held, POST to this URL (frota up's "
        "supervisor starts its workers)")

    add = _flag_adder(parser.add_argument_group("admission and retries"))
    add("--max-inflight", AdmissionDefault.MAX_INFLIGHT,
        "requests in flight across all workers (0: unlimited)")
    add("--max-queue", AdmissionDefault.MAX_QUEUE, "requests waiting for admission; beyond it 429")
    add("--queue-timeout", AdmissionDefault.QUEUE_TIMEOUT_S,
        "seconds a request may wait for admission before 429")
    add("--max-retries", 2, "retries on other workers for failures before the first byte")
    add("--retry-backoff", 0.02, "seconds before the first retry (doubles each retry, jittered)")
    add("--connect-timeout", 3.0)
    add("--read-timeout", 600.0, "longest silence from a worker mid-response, seconds")

    add = _flag_adder(parser.add_argument_group("health"))
    add("--probe-interval", 1.0, "seconds between /ready probes of each worker")
    add("--probe-timeout", 2.0)
    add("--eject-after", 3, "consecutive failures that take a worker out of rotation")


def _discovery(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from frota.router.discovery import StaticDiscovery

    if args.discovery == "static":
        main = ",".join(u for u in (args.workers, args.decode_workers) if u)
        if not main:
            raise SystemExit("frota router: --workers URL,... (or --decode-workers) is required "
                             "with static discovery")
        return StaticDiscovery(main)
    selector = args.selector
    if _disagg_enabled(args):
        selector += f",{Label.ROLE} in (worker,decode)"
    return _kubernetes(args, selector)




def _disagg_enabled(args: argparse.Namespace) -> bool:
    if args.discovery == "static":
        return bool(args.prefill_workers)
    return args.disagg_min_prompt_tokens is not None


def _kube_api(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(the API server's address and credentials, the namespace) of --kubeconfig or the pod."""
    from frota.router.discovery import KubeApi

    api = KubeApi.from_kubeconfig(args.kubeconfig) if args.kubeconfig else KubeApi.in_cluster()
    namespace = args.namespace
    if not namespace:
        ns_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        namespace = Path(ns_file).read_text().strip() if os.path.exists(ns_file) else "default"
    return api, namespace


def _kubernetes(args: argparse.Namespace, selector: str):  # type: ignore[no-untyped-def]
    from frota.router.discovery import KubernetesDiscovery

    if not args.selector:
        raise SystemExit("frota router: --selector is required with --discovery kubernetes")
    api, namespace = _kube_api(args)
    return KubernetesDiscovery(api, namespace, selector, port_name=args.port_name)


def _announcer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """How a held request announces the demand: --announce-demand, --demand-url, or not."""
    from frota.router import hold

    if args.announce_demand and args.demand_url:
        raise SystemExit("frota router: give --announce-demand or --demand-url, not both")
    if args.announce_demand:
        api, namespace = _kube_api(args)
        return hold.kubernetes_announcer(api, namespace, args.announce_demand)
    return hold.url_announcer(args.demand_url) if args.demand_url else None


def _keyring(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The fleet key's keyring, or None without --fleet-key-file."""
    if not args.fleet_key_file:
        return None
    from frota.api.fleet_key import Keyring

    return Keyring.from_file(args.fleet_key_file)


def _disaggregation(args: argparse.Namespace, keyring):  # type: ignore[no-untyped-def]
    """The prefill pool and thresholds, or None when there are no prefill workers."""
    if not _disagg_enabled(args):
        return None
    if keyring is None:
        raise ValueError("disaggregated prefill/decode needs --fleet-key-file: the KV handles "
                         "and the calls to prefill workers are signed with the fleet's key")
    from frota.router.disagg import DisaggConfig, PrefillPool
    from frota.router.discovery import StaticDiscovery

    config = DisaggConfig()
    if args.disagg_min_prompt_tokens is not None:
        config.min_prompt_tokens = int(args.disagg_min_prompt_tokens)
    if args.discovery == "static":
        return PrefillPool(config, StaticDiscovery(args.prefill_workers), keyring)
    return PrefillPool(config, _kubernetes(args, f"{args.selector},{Label.ROLE}=prefill"),
                          keyring)


def is_true(value: object) -> bool:
    """A switch's value: True from the command line, or its environment variable's text."""
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def config_from_args(args: argparse.Namespace,  # type: ignore[no-untyped-def]
                     process: int | None = None):
    """The router's configuration; `process`: this process's index among `--processes`,
    which takes its share of the admission limits."""
    from frota.router.adapters import AdapterConfig, parse_adapter_paths
    from frota.router.admission import process_share
    from frota.router.app import RouterConfig, read_api_keys
    from frota.router.hold import HoldConfig
    from frota.router.processes import siblings
    from frota.router.proxy import ProxyConfig

    num_processes = args.processes if process is not None else 1
    keyring = _keyring(args)

    return RouterConfig(
        policy=PolicyName(args.policy), load_signal=LoadSignal(args.load_signal),
        prefix=PrefixAwareConfig(
            block_chars=args.prefix_block_chars, max_blocks=args.prefix_max_blocks,
            balance=args.prefix_balance, balance_abs=args.prefix_balance_abs,
            hot_window=args.prefix_hot_window),
        session_header=args.session_header,
        max_inflight=process_share(args.max_inflight, num_processes, process or 0),
        max_queue=process_share(args.max_queue, num_processes, process or 0),
        queue_timeout=args.queue_timeout,
        proxy=ProxyConfig(max_retries=args.max_retries, retry_backoff=args.retry_backoff,
                          connect_timeout=args.connect_timeout,
                          read_timeout=args.read_timeout or None,
                          debug_headers=is_true(args.debug_headers)),
        probe_interval=args.probe_interval, probe_timeout=args.probe_timeout,
        eject_after=args.eject_after, drain_timeout=args.drain_timeout,
        limits=Limits(max_connections=args.max_connections,
                      keepalive_timeout=args.keepalive_timeout, write_timeout=args.write_timeout),
        api_keys=read_api_keys(args.api_key_file) if args.api_key_file else frozenset(),
        disagg=_disaggregation(args, keyring),
        keyring=keyring,
        validate_requests=args.validate_requests,
        hold=HoldConfig(seconds=args.hold_seconds, max_held=args.max_held_requests),
        announce=_announcer(args),
        adapters=AdapterConfig(
            runtime_loading=is_true(args.lora_runtime_loading),
            paths=parse_adapter_paths(args.adapters), load_timeout=args.adapter_load_timeout,
            refresh_interval=args.adapter_refresh),
        siblings=siblings(process, args.processes))


async def serve(args: argparse.Namespace, app: RouterApp, process: int | None = None) -> None:
    await app.start(args.host, args.port, reuse_port=process is not None)
    # Everything allocated so far (modules, the app) lives as long as the process: keep
    # it out of the cyclic GC, so full collections stay short on the request path.
    gc.freeze()
    # Young collections every 20,000 allocations, not 700: at 256 streams 700 spent 5% of
    # the router's CPU in collections (docs/benchmarks.md, "Overhead").
    gc.set_threshold(20_000, 50, 100)
    which = f", process {process} of {args.processes}" if process is not None else ""
    print(f"frota router: listening on http://{args.host}:{args.port} "
          f"(policy {args.policy}{which})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()


def run(args: argparse.Namespace) -> int:
    """Serve the router until SIGINT/SIGTERM."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from frota.router.app import build_app
    from frota.router.processes import process_index, supervise

    process = process_index()
    try:  # bad option values (a policy's, an API key file's) fail here, in one line
        if args.processes < 1 or (args.processes > 1 and not args.port):
            raise ValueError("--processes must be >= 1, and needs a fixed --port when > 1")
        app = build_app(config_from_args(args, process), _discovery(args))
    except (ValueError, OSError) as exc:
        print(f"frota router: error: {exc}", file=sys.stderr)
        return 2
    if args.processes > 1 and process is None:
        del app  # the children build their own
        return supervise(args.processes)
    try:
        import uvloop  # optional: faster event loop when installed
    except ImportError:
        asyncio.run(serve(args, app, process))
    else:
        uvloop.run(serve(args, app, process))
    return 0
