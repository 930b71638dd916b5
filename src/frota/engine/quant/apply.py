"""Turn a loaded float model into a quantized one.

`quantize_model` walks the model and replaces every projection (attention,
MLP, experts, optionally the LM head and a tied embedding) by its quantized
form. Weights come from `native` (exact GGUF blocks, see `gguf_native`) where
the config allows it, otherwise from the float weights already in the model.
The MoE router gate and the norms stay float.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from frota.engine.quant.config import QuantConfig
from frota.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, quantize
from frota.engine.quant.gguf_native import concat_rows, native_weight, permute_rows
from frota.engine.quant.linear import Int4Linear, Int8Linear, QuantLinear, make_quant_linear


class QuantEmbedding(nn.Module):
    """An embedding that reads its rows from an int8 LM head's storage (tied weights)."""

    def __init__(self, head: Int8Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.head = [head]  # a list: not a submodule, so its buffers are counted once
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head[0].rows(input_ids, self.dtype)


class QuantExperts(nn.Module):
    """The experts of a `MixtureOfExperts` as quantized linears, indexable like its stacked weights.

    `experts.w13[e]` in the float model is a `[2 ff, hidden]` matrix fed to
    `F.linear`; here `quant_w13[e]` is a `QuantLinear` called instead.
    """

    def __init__(self, w13: list[QuantLinear], w2: list[QuantLinear]) -> None:
        super().__init__()
        self.quant_w13 = nn.ModuleList(w13)
        self.quant_w2 = nn.ModuleList(w2)


def _quant_expert(self, e: int, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """`MixtureOfExperts.expert` with the expert matmuls done by quantized linears."""
    gate, up = self.quant_experts.quant_w13[e](x).chunk(2, dim=-1)
    return self.quant_experts.quant_w2[e](F.silu(gate) * up)


def _accepts_native(config: QuantConfig, weight: QuantizedWeight) -> bool:
    if not config.native_gguf:
        return False
    if isinstance(weight, Int4Weight):
        return config.method == "int4"
    if isinstance(weight, Int8Weight):
        return config.method in ("int8", "int4")
    return False


def _quantize(
    config: QuantConfig, name: str, weight: torch.Tensor, native: Mapping[str, QuantizedWeight]
) -> QuantizedWeight:
    found = native.get(name)
    if found is not None and _accepts_native(config, found):
        if found.shape != tuple(weight.shape):
            raise ValueError(f"native weight {name}: shape {found.shape} != {tuple(weight.shape)}")
        return found
    return quantize(weight.float(), config.method, config.group_size, config.symmetric)


def _linear_names(model: nn.Module, config: QuantConfig) -> Iterator[tuple[str, nn.Linear]]:
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if name.endswith("mlp.gate"):  # the MoE router: tiny, and routing is sensitive
            continue
        if name == "lm_head" and not config.quantize_lm_head:
            continue
        yield name, module


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    config: QuantConfig,
    dtype: torch.dtype,
    native: Mapping[str, QuantizedWeight] | None = None,
    tie_word_embeddings: bool = False,
) -> nn.Module:
    """Replace the model's projections by quantized layers, in place; returns the model.

    `native` maps a fused weight name ("layers.0.self_attn.qkv_proj.weight") to
    an exact quantized weight. Kernel layouts are built for `dtype` at the end,
    so the first request does not pay for them.
    """
    if not config.enabled:
        return model
    native = native or {}
    for name, linear in list(_linear_names(model, config)):
        qweight = _quantize(config, f"{name}.weight", linear.weight, native)
        layer = make_quant_linear(qweight, linear.bias)
        _set_module(model, name, layer)
    for name, module in list(model.named_modules()):
        if hasattr(module, "w13") and hasattr(module, "w2") and hasattr(module, "top_k"):
            _quantize_experts(module, name, config, native)
    if tie_word_embeddings and config.quantize_lm_head:
        head = model.get_submodule("lm_head")
        if isinstance(head, Int8Linear):
            model.embed_tokens = QuantEmbedding(head, dtype)  # type: ignore[assignment]
        else:
            # An int4 kernel layout cannot be read by row: the embedding keeps its floats.
            embed = model.get_submodule("embed_tokens")
            embed.weight = nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
    prepare_kernels(model, dtype)
    return model


def _quantize_experts(
    moe: nn.Module, name: str, config: QuantConfig, native: Mapping[str, QuantizedWeight]
) -> None:
    w13 = [
        make_quant_linear(_quantize(config, f"{name}.w13.{e}", moe.w13[e], native))
        for e in range(moe.w13.shape[0])
    ]
    w2 = [
        make_quant_linear(_quantize(config, f"{name}.w2.{e}", moe.w2[e], native))
        for e in range(moe.w2.shape[0])
    ]
    moe.quant_experts = QuantExperts(w13, w2)
    del moe.w13
    del moe.w2
    moe.expert = _quant_expert.__get__(moe)


def prepare_kernels(model: nn.Module, dtype: torch.dtype) -> None:
    """Build each quantized layer's kernel layout for `dtype` on its device, now."""
    for module in model.modules():
        if isinstance(module, Int4Linear | Int8Linear):
            module.prepare(dtype)


def quantized_weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as held now: parameters and quantized storage (with
    scales), each tensor counted once (a tied embedding is the LM head). Caches such as
    rotary tables are not weights and are left out. A weight held as a plain tensor
    attribute (a linear packed for oneDNN keeps an opaque `packed` tensor) counts too."""
    tensors = list(model.parameters())
    for module in model.modules():
        if isinstance(module, QuantLinear):
            tensors.extend(b for b in module.buffers(recurse=False))
        tensors.extend(
            v for k, v in vars(module).items()
            if isinstance(v, torch.Tensor) and not k.startswith("_") and k in ("packed", "weight")
        )
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        key = tensor.data_ptr() if tensor.layout == torch.strided else id(tensor)
        if key in seen or tensor.device.type == "meta":
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


# ------------------------------------------------------------------ GGUF


_GGUF_LAYER = {
    "attn_q": ("self_attn.qkv_proj", 0, 3),
    "attn_k": ("self_attn.qkv_proj", 1, 3),
    "attn_v": ("self_attn.qkv_proj", 2, 3),
    "attn_output": ("self_attn.o_proj", 0, 1),
    "ffn_gate": ("mlp.gate_up_proj", 0, 2),
    "ffn_up": ("mlp.gate_up_proj", 1, 2),
    "ffn_down": ("mlp.down_proj", 0, 1),
}
_GGUF_EXPERTS = {"ffn_gate_exps": ("w13", 0, 2), "ffn_up_exps": ("w13", 1, 2),
                 "ffn_down_exps": ("w2", 0, 1)}


def _unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary interleave of q/k (as the float loader does)."""
    dim = rows // num_heads // 2
    index = np.arange(rows).reshape(num_heads, dim, 2).swapaxes(2, 1).reshape(rows)
    return torch.from_numpy(index.copy())


def gguf_native_weights(
    path: str, num_heads: int, num_kv_heads: int, tie_word_embeddings: bool
) -> dict[str, QuantizedWeight]:
    """Exact quantized weights of a GGUF file's Q4_0/Q4_1/Q8_0 tensors, under the model's
    fused names. A fused weight whose parts are not all native is left out (it is
    quantized from floats instead)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    parts: dict[str, dict[int, QuantizedWeight | None]] = {}
    counts: dict[str, int] = {}
    out: dict[str, QuantizedWeight] = {}
    for t in reader.tensors:
        dims = [int(d) for d in reversed(t.shape)]  # numpy order: [..., rows, cols]
        type_name = t.tensor_type.name
        if t.name in ("token_embd.weight", "output.weight"):
            w = native_weight(t.data, type_name, dims[0])
            if w is None:
                continue
            if t.name == "output.weight" or tie_word_embeddings:
                out["lm_head.weight"] = w
            continue
        pieces = t.name.split(".")
        if len(pieces) != 4 or pieces[0] != "blk":
            continue
        layer, kind = pieces[1], pieces[2]
        if kind in _GGUF_LAYER:
            target, index, count = _GGUF_LAYER[kind]
            w = native_weight(t.data, type_name, dims[0])
            if w is not None and kind in ("attn_q", "attn_k"):
                heads = num_heads if kind == "attn_q" else num_kv_heads
                w = permute_rows(w, _unpermute_index(dims[0], heads))
            key = f"layers.{layer}.{target}.weight"
            parts.setdefault(key, {})[index] = w
            counts[key] = count
        elif kind in _GGUF_EXPERTS:
            which, index, count = _GGUF_EXPERTS[kind]
            num_experts, rows = dims[0], dims[1]
            w = native_weight(t.data, type_name, num_experts * rows)
            for e in range(num_experts):
                piece = None
                if w is not None:
                    piece = permute_rows(w, torch.arange(e * rows, (e + 1) * rows))
                key = f"layers.{layer}.mlp.{which}.{e}"
                parts.setdefault(key, {})[index] = piece
                counts[key] = count
    for key, found in parts.items():
        if len(found) != counts[key] or any(w is None for w in found.values()):
            continue
        fused = concat_rows([found[i] for i in range(counts[key])])  # type: ignore[misc]
        if fused is not None:
            out[key] = fused
    return out
