"""GGUF: config and tokenizer from the metadata, weights dequantized with the `gguf` package."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch

from frota.engine.config import ModelConfig
from frota.engine.errors import UnsupportedModelError
from frota.engine.model.build import build_model
from frota.engine.model.llama import LlamaForCausalLM
from frota.engine.progress import progress
from frota.engine.tokenizer import Tokenizer, byte_level_bpe

SUPPORTED_ARCHITECTURES = ("llama",)

_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
_EXPERT_NAMES = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        num_experts=int(_field(reader, f"{arch}.expert_count", 0) or 0),
        num_experts_per_tok=int(_field(reader, f"{arch}.expert_used_count", 2) or 2),
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def read_tokenizer(reader, cfg: ModelConfig) -> Tokenizer:
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2' byte-level BPE)"
        )
    backend = byte_level_bpe(
        _field(reader, "tokenizer.ggml.tokens"),
        _field(reader, "tokenizer.ggml.merges") or [],
        _field(reader, "tokenizer.ggml.token_type"),
    )
    return Tokenizer(
        backend,
        eos_token_ids=cfg.eos_token_ids,
        bos_token_id=cfg.bos_token_id,
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter interleaves the rotary halves of q/k; undo it (as transformers does).
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def iter_weights(reader, cfg: ModelConfig, verbose: bool) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    total = len(reader.tensors)
    step = max(1, total // 10)
    for i, t in enumerate(reader.tensors):
        w = dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(d) for d in t.shape])))
        if t.name in _NAMES:
            yield _NAMES[t.name], torch.from_numpy(np.array(w, dtype=np.float32))
        else:
            m = _LAYER.fullmatch(t.name)
            if m is None or (m[2] not in _LAYER_NAMES and m[2] not in _EXPERT_NAMES):
                raise UnsupportedModelError(f"GGUF tensor {t.name!r} is not part of a llama model")
            layer, kind = m[1], m[2]
            if kind == "attn_q":
                w = _unpermute(w, cfg.num_heads)
            elif kind == "attn_k":
                w = _unpermute(w, cfg.num_kv_heads)
            if kind in _EXPERT_NAMES:
                for e in range(w.shape[0]):
                    name = f"layers.{layer}.block_sparse_moe.experts.{e}.{_EXPERT_NAMES[kind]}.weight"
                    yield name, torch.from_numpy(np.array(w[e], dtype=np.float32))
            else:
                name = f"layers.{layer}.{_LAYER_NAMES[kind]}.weight"
                yield name, torch.from_numpy(np.array(w, dtype=np.float32))
        if verbose and ((i + 1) % step == 0 or i + 1 == total):
            progress(verbose, f"dequantized {i + 1}/{total} tensors")


def load_gguf(path: str, dtype: torch.dtype, device: torch.device,
              verbose: bool = True) -> tuple[LlamaForCausalLM, ModelConfig, Tokenizer]:
    """(model, config, tokenizer) from a GGUF file."""
    from gguf import GGUFReader

    progress(verbose, f"reading {path}")
    reader = GGUFReader(path)
    cfg = read_config(reader)
    tokenizer = read_tokenizer(reader, cfg)
    model = build_model(cfg, dtype, device)
    model.load_weights(iter_weights(reader, cfg, verbose))
    progress(verbose, f"loaded {cfg.num_layers} layers, vocab {cfg.vocab_size}, dtype {dtype}")
    return model, cfg, tokenizer
