"""`frota plan FILE`: the topology and memory budget of InferenceService manifests, in words.

`run_on_manifests` is also `frota render`'s (`frota.operator.render_cli`): both read the
InferenceServices of a file and say alike why one is invalid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from frota.api import InferenceService


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="YAML file with one or more InferenceService documents ('-' for stdin)")


def run_on_manifests(command: str, path: str, output: Callable[[list[InferenceService]], str],
                     namespace: str | None = None) -> int:
    """Print `output` of the InferenceServices in `path`; or why not, on stderr, and return 1.

    `namespace`: for the objects whose manifest names none.
    """
    from frota.api.yamlio import read_all
    from frota.plan.validation import SpecError, inference_services

    try:
        services = inference_services(read_all(path), namespace)
        if not services:
            raise ValueError(f"no InferenceService in {path}")
        text = output(services)
    except SpecError as exc:
        print(f"frota {command}: {exc.report()}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"frota {command}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def describe_all(services: list[InferenceService]) -> str:
    """Each InferenceService's plan in words, a blank line between two."""
    from frota.plan.describe import describe
    from frota.plan.planner import plan
    from frota.plan.validation import SpecError

    texts = []
    for isvc in services:
        try:
            texts.append(describe(isvc, plan(isvc)))
        except SpecError as exc:
            raise exc.about(f"InferenceService {isvc.metadata.name}") from None
    return "\n\n".join(texts) + "\n"


def run(args: argparse.Namespace) -> int:
    """Explain what each InferenceService in FILE would run, or why it is invalid."""
    return run_on_manifests("plan", args.file, describe_all)
