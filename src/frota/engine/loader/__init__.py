"""Find a model from its name and load its config, weights and tokenizer."""

from __future__ import annotations

from frota.engine.loader.source import ALIASES, ModelSource, resolve_model

__all__ = ["ALIASES", "ModelSource", "load_model", "resolve_model"]


def load_model(model: str, dtype, device, verbose: bool = True):
    """Return (LlamaForCausalLM, ModelConfig, tokenizer) on `device` in `dtype`."""
    source = resolve_model(model)
    if source.kind == "synthetic":
        from frota.engine.loader.synthetic import load_synthetic

        return load_synthetic(source.path, dtype, device, verbose)
    if source.kind == "gguf":
        from frota.engine.loader.gguf import load_gguf

        return load_gguf(source.path, dtype, device, verbose)
    from frota.engine.loader.safetensors import load_safetensors

    return load_safetensors(source.path, dtype, device, verbose)
