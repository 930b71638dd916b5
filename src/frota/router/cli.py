"""`frota router`: route OpenAI requests across workers.

Every flag can also come from the environment: `--max-inflight` reads
`FROTA_MAX_INFLIGHT`, and so on (`FROTA_` + the flag in upper case, dashes as
underscores). A flag on the command line wins.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frota.api.contract import AdmissionDefault, Label
from frota.router.policies import LoadSignal, PolicyName, PrefixAwareConfig

if TYPE_CHECKING:
    from frota.router.app import RouterApp


def _env(flag: str, default: Any) -> Any:
    return os.environ.get("FROTA_" + flag.lstrip("-").upper().replace("-", "_"), default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, default: Any = None, **kwargs: Any) -> None:
        parser.add_argument(flag, default=_env(flag, default), **kwargs)

    g = parser.add_argument_group("serving")
    g.add_argument("--host", default=_env("--host", "0.0.0.0"), help="address to listen on")
    g.add_argument("--port", type=int, default=_env("--port", 8000), help="port to listen on")
    g.add_argument("--api-key-file", default=_env("--api-key-file", None),
                   help="file with accepted API keys, one per line; without it, no auth")
    g.add_argument("--log-level", default=_env("--log-level", "info"), type=str.lower,
                   choices=["debug", "info", "warning", "error"])
    g.add_argument("--drain-timeout", type=float, default=_env("--drain-timeout", 30.0),
                   help="on SIGTERM, seconds requests in flight may run on before they are "
                        "cut off (new connections are refused at once)")

    g = parser.add_argument_group("discovery")
    g.add_argument("--discovery", default=_env("--discovery", "static"),
                   choices=["static", "kubernetes"], help="where the workers come from")
    g.add_argument("--workers", default=_env("--workers", None),
                   help="static discovery: worker base URLs, comma separated")
    g.add_argument("--namespace", default=_env("--namespace", None),
                   help="kubernetes: namespace of the workers (default: the pod's own)")
    g.add_argument("--selector", default=_env("--selector", None),
                   help="kubernetes: label selector of the workers' EndpointSlices")
    g.add_argument("--kubeconfig", default=_env("--kubeconfig", None),
                   help="kubernetes: kubeconfig path (default: in-cluster service account)")
    g.add_argument("--port-name", default=_env("--port-name", None),
                   help="kubernetes: EndpointSlice port name to use (default: the first port)")

    g = parser.add_argument_group("disaggregated prefill/decode")
    g.add_argument("--prefill-workers", default=_env("--prefill-workers", None),
                   help="static discovery: prefill worker URLs (`frota worker --role prefill`); "
                   "with them, long prompts run prefill there and decode on the main pool")
    g.add_argument("--decode-workers", default=_env("--decode-workers", None),
                   help="static discovery: decode worker URLs (join --workers in the main pool)")
    g.add_argument("--disagg-min-prompt-tokens", type=int,
                   default=_env("--disagg-min-prompt-tokens",
                                os.environ.get("FROTA_MIN_PREFILL_TOKENS") or None),
                   help="shortest prompt (estimated as characters / 4) worth moving KV for; "
                   "shorter ones stay colocated on the main pool (default 256) "
                   "[env also FROTA_MIN_PREFILL_TOKENS]; with --discovery kubernetes, "
                   "setting it turns disaggregation on (prefill pods by frota.dev/role)")

    prefix = PrefixAwareConfig()  # the prefix-aware defaults
    g = parser.add_argument_group("routing")
    g.add_argument("--policy", default=_env("--policy", PolicyName.ROUND_ROBIN.value),
                   choices=[p.value for p in PolicyName], help="how a replica is chosen")
    g.add_argument("--load-signal", default=_env("--load-signal", LoadSignal.OUTSTANDING.value),
                   choices=[s.value for s in LoadSignal],
                   help="least-load: router-side outstanding requests or the workers' /metrics")
    g.add_argument("--prefix-block-chars", type=int,
                   default=_env("--prefix-block-chars", prefix.block_chars),
                   help="prefix-aware: characters per hashed prompt block")
    g.add_argument("--prefix-max-blocks", type=int,
                   default=_env("--prefix-max-blocks", prefix.max_blocks),
                   help="prefix-aware: leading blocks hashed per prompt")
    g.add_argument("--prefix-balance", type=float,
                   default=_env("--prefix-balance", prefix.balance),
                   help="prefix-aware: a worker may take (1 + this) x its fair share of load")
    g.add_argument("--prefix-balance-abs", type=int,
                   default=_env("--prefix-balance-abs", prefix.balance_abs),
                   help="prefix-aware: ... or this many requests more than the least loaded "
                   "worker, whichever allows more (low load)")
    g.add_argument("--prefix-hot-window", type=int,
                   default=_env("--prefix-hot-window", prefix.hot_window),
                   help="prefix-aware: a prefix behind more than a worker's fair share of "
                   "this many latest requests is hot and gets the relative bound only "
                   "(0: no prefix is ever hot)")
    g.add_argument("--prefix-min-match", type=float,
                   default=_env("--prefix-min-match", prefix.min_match),
                   help="prefix-aware: follow a remembered prefix only when it covers this "
                   "fraction of the prompt's blocks; else route to the least loaded worker")
    g.add_argument("--session-header", default=_env("--session-header", "x-session-id"),
                   help="session: header carrying the session key (else the body's `user`)")

    g = parser.add_argument_group("admission and retries")
    g.add_argument("--max-inflight", type=int,
                   default=_env("--max-inflight", AdmissionDefault.MAX_INFLIGHT),
                   help="requests in flight across all workers (0: unlimited)")
    g.add_argument("--max-queue", type=int,
                   default=_env("--max-queue", AdmissionDefault.MAX_QUEUE),
                   help="requests waiting for admission; beyond it 429")
    g.add_argument("--queue-timeout", type=float,
                   default=_env("--queue-timeout", AdmissionDefault.QUEUE_TIMEOUT_S),
                   help="seconds a request may wait for admission before 429")
    g.add_argument("--max-retries", type=int, default=_env("--max-retries", 2),
                   help="retries on other workers for failures before the first byte")
    g.add_argument("--retry-backoff", type=float, default=_env("--retry-backoff", 0.02),
                   help="seconds before the first retry (doubles each retry, jittered)")
    g.add_argument("--connect-timeout", type=float, default=_env("--connect-timeout", 3.0))
    g.add_argument("--read-timeout", type=float, default=_env("--read-timeout", 600.0),
                   help="longest silence from a worker mid-response, seconds")

    g = parser.add_argument_group("health")
    g.add_argument("--probe-interval", type=float, default=_env("--probe-interval", 1.0),
                   help="seconds between /ready probes of each worker")
    g.add_argument("--probe-timeout", type=float, default=_env("--probe-timeout", 2.0))
    g.add_argument("--eject-after", type=int, default=_env("--eject-after", 3),
                   help="consecutive failures that take a worker out of rotation")


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


def _kubernetes(args: argparse.Namespace, selector: str):  # type: ignore[no-untyped-def]
    from frota.router.discovery import KubeApi, KubernetesDiscovery

    if not args.selector:
        raise SystemExit("frota router: --selector is required with --discovery kubernetes")
    api = KubeApi.from_kubeconfig(args.kubeconfig) if args.kubeconfig else KubeApi.in_cluster()
    namespace = args.namespace
    if not namespace:
        ns_file = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        namespace = Path(ns_file).read_text().strip() if os.path.exists(ns_file) else "default"
    return KubernetesDiscovery(api, namespace, selector, port_name=args.port_name)


def _disaggregation(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The prefill pool and thresholds, or None when there are no prefill workers."""
    if not _disagg_enabled(args):
        return None
    from frota.router.disagg import DisaggConfig, Disaggregation
    from frota.router.discovery import StaticDiscovery

    config = DisaggConfig()
    if args.disagg_min_prompt_tokens is not None:
        config.min_prompt_tokens = int(args.disagg_min_prompt_tokens)
    if args.discovery == "static":
        return Disaggregation(config, StaticDiscovery(args.prefill_workers))
    return Disaggregation(config, _kubernetes(args, f"{args.selector},{Label.ROLE}=prefill"))


def config_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from frota.router.app import RouterConfig, read_api_keys
    from frota.router.proxy import ProxyConfig

    return RouterConfig(
        policy=PolicyName(args.policy), load_signal=LoadSignal(args.load_signal),
        prefix=PrefixAwareConfig(
            block_chars=args.prefix_block_chars, max_blocks=args.prefix_max_blocks,
            balance=args.prefix_balance, balance_abs=args.prefix_balance_abs,
            hot_window=args.prefix_hot_window, min_match=args.prefix_min_match),
        session_header=args.session_header,
        max_inflight=args.max_inflight, max_queue=args.max_queue,
        queue_timeout=args.queue_timeout,
        proxy=ProxyConfig(max_retries=args.max_retries, retry_backoff=args.retry_backoff,
                          connect_timeout=args.connect_timeout,
                          read_timeout=args.read_timeout or None),
        probe_interval=args.probe_interval, probe_timeout=args.probe_timeout,
        eject_after=args.eject_after, drain_timeout=args.drain_timeout,
        api_keys=read_api_keys(args.api_key_file) if args.api_key_file else frozenset(),
        disagg=_disaggregation(args))


async def serve(args: argparse.Namespace, app: RouterApp) -> None:
    await app.start(args.host, args.port)
    # Everything allocated so far (modules, the app) lives as long as the process: keep
    # it out of the cyclic GC, so full collections stay short on the request path.
    gc.freeze()
    print(f"frota router: listening on http://{args.host}:{args.port} "
          f"(policy {args.policy})", flush=True)
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

    try:  # bad option values (a policy's, an API key file's) fail here, in one line
        app = build_app(config_from_args(args), _discovery(args))
    except (ValueError, OSError) as exc:
        print(f"frota router: error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # optional: faster event loop when installed
    except ImportError:
        asyncio.run(serve(args, app))
    else:
        uvloop.run(serve(args, app))
    return 0
