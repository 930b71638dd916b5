"""Reading a PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`) into
host tensors, checked against the base model before anything is touched.

Each adapted projection keeps `A` as `[in, r]` and `B` as `[r, out]` (transposed from PEFT's
`lora_A.weight [r, in]` / `lora_B.weight [out, r]`, so the forward is `(x @ A) @ B`), in
float32 with PEFT's scaling folded into B: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with
`use_rslora`. Folding costs nothing at run time and keeps one number less per slot.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from frota.api.memory import LORA_TARGET_MODULES, ModelShape, lora_module_shapes
from frota.engine.lora.errors import AdapterError, AdapterInfo

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's key for a LoRA matrix of a decoder layer's projection (the adapter name "default"
# appears in keys PEFT saved before it stripped it)
_KEY = re.compile(r"(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\."
                  r"(\w+)\.lora_([AB])(?:\.default)?\.weight")
_load_ids = itertools.count(1)


@dataclass(eq=False)
class LoadedAdapter:
    """One load of an adapter: its host weights and where it is resident.

    Identity matters, not the name: a sequence holds the object it was admitted with, so an
    unload and a new load under the same name never change the weights it runs under; and
    `load_id` (unique per load) roots the prefix cache's hash chain of its sequences.
    """

    name: str
    path: str
    rank: int
    targets: tuple[str, ...]
    # (layer, PEFT target) -> (A [in, r], B [r, out] with the scaling folded in), float32
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    load_id: int = field(default_factory=lambda: next(_load_ids))
    slot: int | None = None  # the pool slot holding it, when resident
    num_pins: int = 0  # admitted sequences running under it
    is_unloaded: bool = False

    def info(self) -> AdapterInfo:
        return AdapterInfo(self.name, self.path, self.rank, self.targets, self.slot is not None)


def _config(directory: Path) -> dict:
    path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise AdapterError(f"adapter directory {str(directory)!r} does not exist")
    if not path.is_file():
        raise AdapterError(f"{CONFIG_FILE} is missing from {str(directory)!r}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{CONFIG_FILE} in {str(directory)!r} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG_FILE} in {str(directory)!r} is not a JSON object")
    return config


def _check_config(config: dict, allowed: tuple[str, ...], max_rank: int) -> tuple[int, float]:
    """(rank, scaling) from a PEFT LoraConfig; raises AdapterError for what Frota cannot serve."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r} is not supported: use a LoRA adapter")
    for key, what in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"),
                      ("rank_pattern", "rank_pattern"), ("alpha_pattern", "alpha_pattern")):
        if config.get(key):
            raise AdapterError(f"{what} is not supported: Frota serves plain LoRA with one rank "
                               f"and one alpha")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias {config['bias']!r} is not supported: use bias 'none'")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unsupported = sorted(set(targets) - set(allowed))
        if unsupported:
            raise AdapterError(f"unsupported target module(s) {', '.join(unsupported)}: "
                               f"targets must be among {', '.join(allowed)}")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"rank r={rank!r} in {CONFIG_FILE}: use a positive integer")
    if rank > max_rank:
        raise AdapterError(f"rank {rank} is above max_lora_rank {max_rank}: start the engine "
                           f"with a larger max_lora_rank or use a smaller adapter")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float):
        raise AdapterError(f"lora_alpha {alpha!r} in {CONFIG_FILE}: use a number")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise AdapterError(f"{WEIGHTS_FILE} is missing from {str(directory)!r}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise AdapterError(f"{WEIGHTS_FILE} in {str(directory)!r} is corrupt: {exc}") from exc


def read_adapter(name: str, path: str, shape: ModelShape, max_rank: int) -> LoadedAdapter:
    """Read and validate the PEFT adapter at `path` for a base of `shape`; raises AdapterError."""
    if not isinstance(name, str) or not name.strip():
        raise AdapterError("an adapter needs a non-empty name")
    modules = lora_module_shapes(shape)  # (out, in) of each projection this base can adapt
    allowed = tuple(t for t in LORA_TARGET_MODULES if t in modules)
    directory = Path(path)
    rank, scaling = _check_config(_config(directory), allowed, max_rank)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _tensors(directory).items():
        match = _KEY.fullmatch(key)
        if match is None or match[2] not in allowed:
            raise AdapterError(f"unsupported target: tensor {key!r}; targets must be the "
                               f"projections {', '.join(allowed)} of the decoder layers")
        layer = int(match[1])
        if layer >= shape.num_layers:
            raise AdapterError(f"tensor {key!r}: layer {layer}, but the base model has "
                               f"{shape.num_layers} layers (an adapter for another model?)")
        pairs.setdefault((layer, match[2]), {})[match[3]] = tensor
    if not pairs:
        raise AdapterError(f"{WEIGHTS_FILE} in {str(directory)!r} holds no LoRA weights")
    weights = {}
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise AdapterError(f"layer {layer} {target}: {missing} is missing")
        a, b = ab["A"], ab["B"]
        out_features, in_features = modules[target]
        if tuple(a.shape) != (rank, in_features) or tuple(b.shape) != (out_features, rank):
            raise AdapterError(
                f"wrong base shape: layer {layer} {target} has lora_A {tuple(a.shape)} and lora_B "
                f"{tuple(b.shape)}; this base model (rank {rank}) needs {(rank, in_features)} and "
                f"{(out_features, rank)}")
        weights[(layer, target)] = (a.float().t().contiguous(),
                                    (b.float() * scaling).t().contiguous())
    targets = tuple(t for t in allowed if any(k[1] == t for k in weights))
    return LoadedAdapter(name, str(path), rank, targets, weights)
