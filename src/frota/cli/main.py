"""The `frota` command line.

Each subcommand lives beside the code it drives, in a module that exposes
`add_arguments(parser)` and `run(args) -> int`. Those modules import their
heavy dependencies (torch, the engine) inside `run`, so `frota --help`, `frota
render` and the operator image never load torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order `frota --help` shows.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("frota.local.up", "run a whole fleet (router + workers) as local processes"),
    "status": ("frota.local.status", "show the local fleet started by `frota up`"),
    "worker": ("frota.server.cli", "serve a model over the OpenAI API (one worker rank)"),
    "router": ("frota.router.cli", "route OpenAI requests across workers"),
    "generate": ("frota.cli.generate", "generate text offline with the engine"),
    "eval": ("frota.cli.eval", "evaluate a model (perplexity)"),
    "fetch": ("frota.cli.fetch", "download a model or LoRA adapter (hf://, https://) into a directory"),
    "cache": ("frota.cli.cache", "fill the shared model cache once (a Job), or wait for it (a worker's init)"),
    "convert": ("frota.cli.convert", "write a GGUF model as an HF-layout directory (vLLM workers)"),
    "operator": ("frota.operator.cli", "run the Kubernetes operator (kopf)"),
    "crd": ("frota.api.cli", "print the InferenceService CustomResourceDefinition"),
    "render": ("frota.operator.render_cli", "print the child objects of a manifest"),
    "plan": ("frota.plan.cli", "print the topology and memory budget of a manifest"),
}


def build_parser(available: dict[str, object]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frota", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in available.items():
        _, help_text = SUBCOMMANDS[name]
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sp)  # type: ignore[attr-defined]
        sp.set_defaults(_run=module.run)  # type: ignore[attr-defined]
    return parser


def _load_subcommands(only: str | None) -> dict[str, object]:
    """Import subcommand modules; with `only`, import just that one (fast start)."""
    names = [only] if only in SUBCOMMANDS else list(SUBCOMMANDS)
    loaded: dict[str, object] = {}
    for name in names:
        module_name, _ = SUBCOMMANDS[name]
        try:
            loaded[name] = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A subcommand whose module is not built yet (or whose extra is not
            # installed) is left out of --help rather than breaking the CLI.
            if only == name:
                raise SystemExit(f"frota {name}: unavailable ({exc})") from exc
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(_load_subcommands(first))
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
