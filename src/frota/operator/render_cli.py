"""`frota render FILE`: print the child objects of InferenceService manifests as multi-doc YAML."""

from __future__ import annotations

import argparse
import sys

from frota.api.yamlio import dump_all, load_all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="YAML file with one or more InferenceService documents ('-' for stdin)")
    parser.add_argument("-n", "--namespace", help="namespace for objects whose manifest names none")
    parser.add_argument("--include-source", action="store_true",
                        help="also print each InferenceService (defaults filled in) before its children")


def read_documents(path: str) -> list:
    """The YAML documents of a file, or of stdin for '-'."""
    if path == "-":
        return load_all(sys.stdin.read())
    with open(path, encoding="utf-8") as fh:
        return load_all(fh.read())


def run(args: argparse.Namespace) -> int:
    """Render every InferenceService in FILE into its child objects, like `helm template`."""
    from frota.operator.render import inference_services, render
    from frota.operator.validation import SpecError

    objects = []
    try:
        services = inference_services(read_documents(args.file), args.namespace)
        if not services:
            print(f"frota render: no InferenceService in {args.file}", file=sys.stderr)
            return 1
        for isvc in services:
            topology, children = render(isvc)
            for warning in topology.warnings:
                print(f"frota render: warning: {warning}", file=sys.stderr)
            if args.include_source:
                objects.append(isvc.to_wire())
            objects += children
    except SpecError as exc:
        print(f"frota render: {exc.report()}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"frota render: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(dump_all(objects))
    return 0
