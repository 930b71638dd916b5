"""The engine's start-up progress lines (loading, quantizing, sizing the KV cache)."""

from __future__ import annotations


def progress(verbose: bool, message: str) -> None:
    if verbose:
        print(f"[frota.engine] {message}", flush=True)
