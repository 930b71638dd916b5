"""`frota crd`: print the InferenceService CustomResourceDefinition as YAML."""

from __future__ import annotations

import argparse

from frota.api.yamlio import dump_all, write_out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    """Print the CRD generated from the pydantic models (the source of truth)."""
    from frota.api.crd import crd

    write_out(dump_all([crd()]), args.output)
    return 0
