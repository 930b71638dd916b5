"""Write a model as an HF-layout directory: config.json, model.safetensors, tokenizer files.

Other engines (vLLM) load HF-layout checkpoints, while Frota's embedded model ships as
GGUF. `export_hf` reads a GGUF with the engine's own loader (dequantized, q/k rotary
halves restored), so the directory holds exactly the weights Frota's runtime serves,
and Frota's safetensors loader reads it back to the same model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from frota.engine.config import ModelConfig
from frota.engine.errors import UnsupportedModelError
from frota.engine.loader.source import resolve_model
from frota.engine.progress import progress
from frota.engine.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Exported:
    """What `export_hf` wrote."""

    directory: Path
    architecture: str
    tensors: int
    bytes: int


def hf_config(cfg: ModelConfig, dtype: str) -> dict:
    """The transformers `config.json` of a Frota `ModelConfig` (llama, or mixtral with experts)."""
    moe = cfg.num_experts > 0
    config = {
        "architectures": ["MixtralForCausalLM" if moe else "LlamaForCausalLM"],
        "model_type": "mixtral" if moe else "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids) if len(cfg.eos_token_ids) != 1 else cfg.eos_token_ids[0],
        "torch_dtype": dtype,
    }
    if moe:
        config["num_local_experts"] = cfg.num_experts
        config["num_experts_per_tok"] = cfg.num_experts_per_tok
    return config


def hf_tensor_name(name: str) -> str:
    """The transformers name of a tensor the loaders yield (`layers.0.mlp.gate` -> `model.layers.0...`)."""
    if name == "lm_head.weight":
        return name
    return "model." + name.replace(".mlp.gate.", ".block_sparse_moe.gate.")


def tokenizer_config(tokenizer: Tokenizer, cfg: ModelConfig) -> dict:
    """`tokenizer_config.json`: the special tokens and chat template transformers and vLLM read."""

    def token(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.backend.id_to_token(token_id)

    config: dict = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.max_position,
        "add_bos_token": tokenizer.add_bos_token,
        "clean_up_tokenization_spaces": False,
    }
    if (bos := token(tokenizer.bos_token_id)) is not None:
        config["bos_token"] = bos
    if tokenizer.eos_token_ids and (eos := token(tokenizer.eos_token_ids[0])) is not None:
        config["eos_token"] = eos
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    return config


def export_hf(model: str, directory: str | Path, dtype: str = "float32", verbose: bool = True) -> Exported:
    """Write `model` (an alias or a .gguf file) into `directory` as an HF-layout checkpoint."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from frota.engine.loader.gguf import iter_weights, read_config, read_tokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    source = resolve_model(model)
    if source.kind != "gguf":
        raise UnsupportedModelError(
            f"model {model!r} is {source.kind}: only GGUF models need converting "
            "(an HF-layout directory is served as it is; synthetic models have no tokenizer to export)"
        )
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(source.path)
    cfg = read_config(reader)
    tokenizer = read_tokenizer(reader, cfg)
    progress(verbose, f"converting {source.path} -> {out} ({dtype})")
    tensors = {
        hf_tensor_name(name): tensor.to(DTYPES[dtype]).contiguous()
        for name, tensor in iter_weights(reader, cfg, verbose)
    }
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = hf_config(cfg, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer, cfg), indent=2) + "\n")
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    progress(verbose, f"wrote {len(tensors)} tensors ({size / 2**20:.0f} MiB) to {out}")
    return Exported(out, config["architectures"][0], len(tensors), size)
