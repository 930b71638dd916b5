"""`frota operator`: run the InferenceService operator (kopf) in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import secrets

from frota.operator.settings import OperatorSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], metavar="NS",
        help="watch this namespace (repeatable; globs like 'team-*' work); default: all",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true",
        help="watch every namespace (the default when no --namespace is given)",
    )
    parser.add_argument("--metrics-port", type=int,
                        default=int(os.environ.get("FROTA_METRICS_PORT", "9090")),
                        help="port of the Prometheus /metrics endpoint, 0 for none "
                             "(env FROTA_METRICS_PORT; default 9090)")
    parser.add_argument("--liveness", metavar="URL",
                        default=os.environ.get("FROTA_LIVENESS", "http://0.0.0.0:8080/healthz"),
                        help="kopf's health endpoint, empty for none "
                             "(env FROTA_LIVENESS; default http://0.0.0.0:8080/healthz)")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", metavar="NAME", default=None,
        help="kopf peering object shared by operator replicas: one is active, the rest stand by",
    )
    peering.add_argument("--standalone", action="store_true",
                         help="run without peering (a single replica, or tests)")
    parser.add_argument("--priority", type=int, default=_env_priority(), metavar="N",
                        help="this replica's peering priority: the highest live one is active "
                             "(env FROTA_OPERATOR_PRIORITY; default: drawn at random per start, "
                             "so that two replicas never tie)")
    parser.add_argument("--autoscale-interval", type=float, default=15.0, metavar="SECONDS",
                        help="how often autoscaled InferenceServices read the router's metrics")
    parser.add_argument("--capacity-report-interval", type=float, default=30.0, metavar="SECONDS",
                        help="how often InferenceServices read the KV cache their serving "
                             "workers report (status.capacity)")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def _env_priority() -> int | None:
    value = os.environ.get("FROTA_OPERATOR_PRIORITY", "")
    return int(value) if value else None


def peering_priority(args: argparse.Namespace) -> int:
    """This replica's kopf peering priority.

    kopf pauses *every* replica when two live peers share a priority ("possibly conflicting
    operators"), so replicas started from one Deployment, which share their flags, must not
    share kopf's default of 0. Unless set, each start draws one from 2**31 values: the
    chance that two replicas tie is one in two billion, and a restart draws again.
    """
    if args.priority is not None:
        return args.priority
    return 1 + secrets.randbelow(2**31 - 1)


def settings_of(args: argparse.Namespace) -> OperatorSettings:
    """The operator's settings from its flags."""
    return OperatorSettings(namespaces=tuple(args.namespace),
                            autoscale_interval_seconds=args.autoscale_interval,
                            capacity_report_interval_seconds=args.capacity_report_interval)


def run(args: argparse.Namespace) -> int:
    """Start the operator: kopf with Frota's handlers, metrics and health endpoints."""
    import kopf
    from prometheus_client import start_http_server

    from frota.operator.loop import handlers
    from frota.operator.loop.state import OperatorState

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_of(args)
    state = OperatorState(settings)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=state.metrics.registry)
    kopf.run(
        registry=handlers.registry(settings),
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=args.standalone or None,
        peering_name=args.peering,
        priority=peering_priority(args),
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(state=state),
    )
    return 0
