"""`frota fetch URI --dest PATH`: download a model or a LoRA adapter (what the operator's
init containers run for `hf://` and `https://` URIs). The layouts, the trust and the
atomic write are `frota.server.fetch`'s, shared with the worker's runtime loads."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="https://HOST/DIR/ (adapter or HF-layout model), "
                        "https://.../NAME.tar.gz|.tgz|.tar|.gguf, or hf://ORG/REPO")
    parser.add_argument("--dest", required=True,
                        help="where the download goes (a directory; a file for a .gguf URL); "
                        "written atomically")
    parser.add_argument("--kind", choices=["auto", "adapter", "model"], default="auto",
                        help="what the URI holds (default: auto, an adapter when a directory "
                        "has adapter_config.json)")
    parser.add_argument("--sha256", type=sha256_arg, default=None,
                        help="the source's pinned sha256 (spec.model.sha256): a file's, an archive's, "
                        "or a directory's as `frota cache digest` prints it; a mismatch leaves nothing")


def sha256_arg(text: str) -> str:
    """64 lowercase hex digits, as spec.model.sha256 and `sha256sum` write them."""
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a sha256: 64 lowercase hex digits")
    return text


def run(args: argparse.Namespace) -> int:
    import sys

    # Lazily: the command line sits above the data plane (tests/test_layering.py).
    from frota.server.fetch import FetchError, fetch

    try:
        dest = fetch(args.uri, args.dest, args.kind, args.sha256)
    except FetchError as exc:
        print(f"frota fetch: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the destination: a read-only or full volume
        print(f"frota fetch: {args.uri}: cannot write {args.dest}: {exc}", file=sys.stderr)
        return 1
    print(f"frota fetch: {args.uri} -> {dest}", file=sys.stderr)
    return 0
