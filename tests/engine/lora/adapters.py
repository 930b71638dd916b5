"""PEFT-format adapters for tests: written by PEFT itself over SmolLM2 (the exactness
references, `conftest.py`), or tensor by tensor for any shape (synthetic models, bad files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from frota.api.memory import ModelShape, lora_module_shapes

_MODULE_GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                 "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(directory: Path, shape: ModelShape, *, rank: int, targets: list[str],
                  alpha: float = 16, seed: int = 0, rslora: bool = False,
                  scale: float = 0.1) -> Path:
    """A seeded PEFT LoRA adapter for a base of `shape` (A and B both random, so it changes
    the output), saved as PEFT saves one."""
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    shapes = lora_module_shapes(shape)
    tensors = {}
    for layer in range(shape.num_layers):
        for target in targets:
            out_features, in_features = shapes[target]
            key = f"base_model.model.model.layers.{layer}.{_MODULE_GROUP[target]}.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_features, generator=g) * scale
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_features, rank, generator=g) * scale
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets,
              "use_rslora": rslora, "bias": "none", "task_type": "CAUSAL_LM"}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory
