"""`frota render FILE`: print the child objects of InferenceService manifests as multi-doc YAML."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from frota.api import InferenceService
from frota.api.yamlio import dump_all
from frota.plan.cli import run_on_manifests


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="YAML file with one or more InferenceService documents ('-' for stdin)")
    parser.add_argument("-n", "--namespace", help="namespace for objects whose manifest names none")
    parser.add_argument("--include-source", action="store_true",
                        help="also print each InferenceService (defaults filled in) before its children")
    parser.epilog = ("Every child but the fleet key's Secret: the operator creates that one on the "
                     "cluster, with a random key that nothing prints.")


def run(args: argparse.Namespace) -> int:
    """Render every InferenceService in FILE into its child objects, like `helm template`
    (all but the fleet key's Secret, whose key the operator makes on the cluster)."""
    from frota.operator.render import render

    def children(services: list[InferenceService]) -> str:
        objects: list[dict[str, Any]] = []
        for isvc in services:
            topology, built = render(isvc)
            for warning in topology.warnings:
                print(f"frota render: warning: {warning}", file=sys.stderr)
            if args.include_source:
                objects.append(isvc.to_wire())
            objects += built
        return dump_all(objects)

    return run_on_manifests("render", args.file, children, args.namespace)
