"""Find a model from its name and load its config, weights and tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frota.engine.loader.source import ResolvedModel, resolve_model

__all__ = ["ResolvedModel", "load_model", "resolve_model"]


if TYPE_CHECKING:
    import torch

    from frota.engine.config import ModelConfig
    from frota.engine.model.llama import LlamaForCausalLM
    from frota.engine.tokenizer import ByteTokenizer, Tokenizer

    # what a loader returns, and an engine takes to share weights
    Loaded = tuple[LlamaForCausalLM, ModelConfig, Tokenizer | ByteTokenizer]


def load_model(model: str, dtype: torch.dtype, device: torch.device, verbose: bool = True) -> Loaded:
    """Return (LlamaForCausalLM, ModelConfig, tokenizer) on `device` in `dtype`.

    A model in a model cache (a directory with the marker `.frota-cache.json`, as
    spec.model.cache mounts it) is checked against the cache's manifest first, every file
    hashed: a worker container restarted in its pod runs no init container again, so this
    is the check between the bytes on the volume and the bytes served."""
    import time

    from frota.engine.loader.cache_manifest import verify_model
    from frota.engine.progress import progress

    source = resolve_model(model)
    started = time.monotonic()
    if (manifest := verify_model(model)) is not None:
        progress(verbose, f"{len(manifest.files)} cached files ({manifest.bytes} bytes) match the "
                 f"cache's manifest ({time.monotonic() - started:.1f}s)")
    if source.kind == "synthetic":
        from frota.engine.loader.synthetic import load_synthetic

        return load_synthetic(source.path, dtype, device, verbose)
    if source.kind == "gguf":
        from frota.engine.loader.gguf import load_gguf

        return load_gguf(source.path, dtype, device, verbose)
    from frota.engine.loader.safetensors import load_safetensors

    return load_safetensors(source.path, dtype, device, verbose)
