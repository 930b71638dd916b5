"""`frota plan FILE`: the topology and memory budget of InferenceService manifests, in words."""

from __future__ import annotations

import argparse
import sys

from frota.operator.render_cli import read_documents


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="YAML file with one or more InferenceService documents ('-' for stdin)")


def run(args: argparse.Namespace) -> int:
    """Explain what each InferenceService in FILE would run, or why it is invalid."""
    from frota.operator.describe import describe
    from frota.operator.planner import plan
    from frota.operator.render import inference_services
    from frota.operator.validation import SpecError

    try:
        services = inference_services(read_documents(args.file))
        if not services:
            print(f"frota plan: no InferenceService in {args.file}", file=sys.stderr)
            return 1
        texts = []
        for isvc in services:
            try:
                texts.append(describe(isvc, plan(isvc)))
            except SpecError as exc:
                raise exc.about(f"InferenceService {isvc.metadata.name}") from None
    except SpecError as exc:
        print(f"frota plan: {exc.report()}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"frota plan: {exc}", file=sys.stderr)
        return 1
    print("\n\n".join(texts))
    return 0
