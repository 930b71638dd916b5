"""`frota crd`: print the InferenceService CustomResourceDefinition as YAML."""

from __future__ import annotations

import argparse
import sys

from frota.api.yamlio import dump_all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    """Print the CRD generated from the pydantic models (the source of truth)."""
    from frota.api.crd import crd

    text = dump_all([crd()])
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
