"""A model loaded in float32, quantized: weights quantized where the method says, the rest
cast to the serving dtype. A GGUF model keeps its Q4_0/Q4_1/Q8_0 tensors exactly.
`load_as_served` loads a model as an engine serves it: in its dtype, or so quantized.

It sits with the loader because it needs to know where the weights came from (a GGUF file's
native blocks); `frota.engine.quant` itself knows neither files nor models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from frota.engine.config import ModelConfig
from frota.engine.loader import load_model
from frota.engine.loader.source import resolve_model
from frota.engine.model.build import cast_keeping_caches
from frota.engine.progress import progress
from frota.engine.quant.apply import gguf_native_weights, quantize_model
from frota.engine.quant.config import QuantConfig
from frota.engine.quant.formats import QuantizedWeight

if TYPE_CHECKING:
    from frota.engine.loader import Loaded


def quantize_loaded_model(
    model: nn.Module,
    cfg: ModelConfig,
    model_name: str,
    method: str,
    dtype: torch.dtype,
) -> nn.Module:
    """The engine's hook: quantize a model loaded in float32, then cast what stays float to `dtype`.

    A GGUF model keeps its Q4_0/Q4_1/Q8_0 tensors exactly (see `QuantConfig.native_gguf`).
    """
    config = QuantConfig(method)
    if not config.enabled:
        return model.to(dtype)
    tied = cfg.tie_word_embeddings
    native: dict[str, QuantizedWeight] = {}
    source = resolve_model(model_name)
    if source.kind == "gguf" and config.native_gguf:
        native = gguf_native_weights(source.path, cfg.num_heads, cfg.num_kv_heads, tied)
    quantize_model(model, config, dtype, native, tied)
    return cast_keeping_caches(model, dtype)


def load_as_served(model_name: str, quantization: str, dtype: torch.dtype, device: torch.device,
                   verbose: bool) -> Loaded:
    """(model, config, tokenizer) in `dtype`; with a `quantization` other than none, loaded in
    float32 and quantized from there (`quantize_loaded_model`)."""
    if quantization == "none":
        return load_model(model_name, dtype, device, verbose)
    model, cfg, tokenizer = load_model(model_name, torch.float32, device, verbose)
    model = quantize_loaded_model(model, cfg, model_name, quantization, dtype)
    progress(verbose, f"quantized the weights to {quantization}")
    return model, cfg, tokenizer
