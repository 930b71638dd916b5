"""HF-layout checkpoints: config.json + *.safetensors (+ tokenizer.json, tokenizer_config.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from frota.engine.config import ModelConfig
from frota.engine.errors import ModelNotFoundError, UnsupportedModelError
from frota.engine.loader.safetensors_header import read_header
from frota.engine.model.build import build_model
from frota.engine.model.llama import LlamaForCausalLM
from frota.engine.progress import progress
from frota.engine.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")


def read_config(path: Path) -> ModelConfig:
    hf = json.loads((path / "config.json").read_text())
    archs = hf.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise UnsupportedModelError(
            f"{path}: architecture {archs} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise UnsupportedModelError(f"{path}: rope scaling {rope.get('rope_type')!r} is not supported")
    heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        max_position=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        num_experts=hf.get("num_local_experts", 0) or 0,
        num_experts_per_tok=hf.get("num_experts_per_tok", 2),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
    )


def read_tokenizer(path: Path, cfg: ModelConfig) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    if not (path / "tokenizer.json").is_file():
        raise ModelNotFoundError(f"{path}: tokenizer.json is missing")
    backend = Backend.from_file(str(path / "tokenizer.json"))
    tc_path = path / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
    template = tc.get("chat_template")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    eos_ids = list(cfg.eos_token_ids)
    eos_token = tc.get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    if eos_token and (tid := backend.token_to_id(eos_token)) is not None and tid not in eos_ids:
        eos_ids.append(tid)
    return Tokenizer(backend, eos_token_ids=eos_ids, bos_token_id=cfg.bos_token_id,
                     add_bos_token=bool(tc.get("add_bos_token", False)), chat_template=template)


# safetensors' dtype names -> torch's (the names safetensors_header.DTYPE_BYTES knows)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def mapped_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one .safetensors file as views of the file, memory-mapped.

    The header is checked first (`safetensors_header`: every tensor's bytes inside the
    file, none overlapping another, as many as its dtype and shape need), so each view
    is of its own bytes. The mapping is private and read lazily, so a tensor costs no
    memory until the model copies it into its own parameter (converting the dtype in that
    one copy, if it differs): the file's bytes are read once, with no intermediate tensor.
    A tensor whose offset its dtype cannot be viewed at is copied.
    """
    size = file.stat().st_size
    with file.open("rb") as f:
        header = read_header(file, f, size)
    data = torch.UntypedStorage.from_file(str(file), shared=False, nbytes=size)
    raw = torch.empty(0, dtype=torch.uint8).set_(data)[header.data_start:]
    for t in header.tensors:
        dtype = _DTYPES[t.dtype]
        chunk = raw[t.begin:t.end]
        if (header.data_start + t.begin) % dtype.itemsize:
            chunk = chunk.clone()  # unaligned for its dtype: a copy that is
        yield t.name, chunk.view(dtype).view(t.shape)


def iter_weights(path: Path, verbose: bool) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    for i, file in enumerate(files):
        yield from mapped_tensors(file)
        progress(verbose, f"read {i + 1}/{len(files)} safetensors files")


def load_safetensors(path: str, dtype: torch.dtype, device: torch.device,
                     verbose: bool = True) -> tuple[LlamaForCausalLM, ModelConfig, Tokenizer]:
    """(model, config, tokenizer) from an HF-layout directory."""
    root = Path(path)
    cfg = read_config(root)
    tokenizer = read_tokenizer(root, cfg)
    model = build_model(cfg, dtype, device)
    model.load_weights(iter_weights(root, verbose))
    progress(verbose, f"loaded {cfg.num_layers} layers, vocab {cfg.vocab_size}, dtype {dtype}")
    return model, cfg, tokenizer
