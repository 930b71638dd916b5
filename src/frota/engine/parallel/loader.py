"""A rank's shard of the model: built at shard size, filled one checkpoint tensor at a time.

Each full tensor from the checkpoint (GGUF, safetensors or synthetic) is read once,
sliced to this rank's rows or columns and copied into place, so a rank never holds
more than its shard plus the one tensor being read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from frota.engine.config import ModelConfig
from frota.engine.loader.source import resolve_model
from frota.engine.model.layers import RotaryEmbedding
from frota.engine.model.llama import LlamaForCausalLM
from frota.engine.parallel.comm import Comm
from frota.engine.parallel.config import ParallelConfig, stage_layers, validate_model
from frota.engine.parallel.layers import (
    ExpertParallelMoE,
    RowParallel,
    VocabParallelEmbedding,
    VocabParallelHead,
)
from frota.engine.progress import progress


@dataclasses.dataclass
class ShardLayout:
    """Which slice of each dimension this rank holds."""

    cfg: ModelConfig  # the full model
    pc: ParallelConfig
    layers: range
    num_heads: int
    num_kv_heads: int
    kv_head_start: int
    intermediate: int  # dense MLP shard, or this rank's shard of each expert
    vocab_shard: int
    first_expert: int
    num_local_experts: int

    @classmethod
    def of(cls, cfg: ModelConfig, pc: ParallelConfig) -> ShardLayout:
        t = pc.tensor
        if cfg.num_kv_heads >= t:
            kv, kv_start = cfg.num_kv_heads // t, pc.tp_rank * (cfg.num_kv_heads // t)
        else:  # fewer KV heads than ranks: each rank keeps the one its query heads read
            kv, kv_start = 1, pc.tp_rank * cfg.num_kv_heads // t
        local_experts = cfg.num_experts // pc.expert if cfg.is_moe else 0
        inter = cfg.intermediate_size // (pc.expert_tp if cfg.is_moe else t)
        return cls(cfg, pc, stage_layers(pc, cfg.num_layers), cfg.num_heads // t, kv, kv_start,
                   inter, -(-cfg.vocab_size // t), pc.ep_rank * local_experts, local_experts)

    @property
    def local_config(self) -> ModelConfig:
        """The config of the modules this rank builds (its heads, its layers, its KV)."""
        return dataclasses.replace(
            self.cfg, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate, num_layers=len(self.layers),
            vocab_size=self.vocab_shard, num_experts=0)

    @property
    def is_first(self) -> bool:
        return self.pc.stage == 0

    @property
    def is_last(self) -> bool:
        return self.pc.stage == self.pc.pipeline - 1


def build_shard(cfg: ModelConfig, pc: ParallelConfig, comm: Comm, dtype: torch.dtype,
                device: torch.device) -> tuple[LlamaForCausalLM, ShardLayout]:
    """This rank's modules, uninitialized, wrapped for tensor parallelism."""
    validate_model(pc, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                   num_layers=cfg.num_layers, intermediate_size=cfg.intermediate_size,
                   num_experts=cfg.num_experts)
    layout = ShardLayout.of(cfg, pc)
    local = layout.local_config
    with torch.device("meta"):
        model = LlamaForCausalLM(local)
        for layer in model.layers:
            layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, comm)
            if cfg.is_moe:
                layer.mlp = ExpertParallelMoE(
                    cfg.hidden_size, layout.intermediate, cfg.num_experts, cfg.num_experts_per_tok,
                    layout.first_expert, layout.num_local_experts, comm, pc.capacity_factor)
            else:
                layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, comm)
        # Pipeline stages keep only the ends they use.
        if layout.is_first:
            model.embed_tokens = VocabParallelEmbedding(
                model.embed_tokens, pc.tp_rank * layout.vocab_shard, comm)
        else:
            model.embed_tokens = None
        model.lm_head = VocabParallelHead(model.lm_head, cfg.vocab_size, comm) if layout.is_last else None
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings and layout.is_first and layout.is_last:
        model.lm_head.inner.weight = model.embed_tokens.inner.weight
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta).to(device)
    for layer in model.layers:
        layer.self_attn.rotary = rotary
    model.eval()
    return model, layout


class ShardLoader:
    """Copies this rank's slice of each full, HF-named (or engine-fused) tensor into the shard."""

    def __init__(self, model: LlamaForCausalLM, layout: ShardLayout) -> None:
        self.model = model
        self.layout = layout
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.loaded: set[str] = set()

    def _put(self, name: str, value: torch.Tensor, index: object = None) -> None:
        """Copy `value` into the parameter `name` (or into `param[index]`)."""
        param = self.params[name]
        target = param if index is None else param[index]
        if target.shape != value.shape:
            raise ValueError(f"weight {name!r}: shard shape {tuple(value.shape)}, model expects "
                             f"{tuple(target.shape)}")
        target.copy_(value.to(param.dtype))
        self.loaded.add(name)

    # -- slices of the full tensors ------------------------------------------------------

    def _heads(self, w: torch.Tensor, start: int, count: int, dim: int = 0) -> torch.Tensor:
        d = self.layout.cfg.head_dim
        return w.narrow(dim, start * d, count * d)

    def _q(self, w: torch.Tensor, dim: int = 0) -> torch.Tensor:
        lay = self.layout
        return self._heads(w, lay.pc.tp_rank * lay.num_heads, lay.num_heads, dim)

    def _kv(self, w: torch.Tensor) -> torch.Tensor:
        return self._heads(w, self.layout.kv_head_start, self.layout.num_kv_heads)

    def _ff(self, w: torch.Tensor, dim: int = 0) -> torch.Tensor:
        lay = self.layout
        rank = lay.pc.expert_tp_rank if lay.cfg.is_moe else lay.pc.tp_rank
        return w.narrow(dim, rank * lay.intermediate, lay.intermediate)

    def _vocab(self, w: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        start, n = lay.pc.tp_rank * lay.vocab_shard, lay.vocab_shard
        shard = w[start : start + n]
        if shard.shape[0] < n:  # the last shard is padded with zero rows (never looked up)
            shard = torch.cat([shard, shard.new_zeros(n - shard.shape[0], *shard.shape[1:])])
        return shard

    # -- one tensor ----------------------------------------------------------------------

    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        lay = self.layout
        for name, w in weights:
            name = name.removeprefix("model.").replace(".block_sparse_moe.gate.", ".mlp.gate.")
            if "rotary_emb" in name:
                continue
            if name == "embed_tokens.weight":
                if self.model.embed_tokens is not None:
                    self._put("embed_tokens.inner.weight", self._vocab(w))
                if lay.cfg.tie_word_embeddings and self.model.lm_head is not None:
                    self._put("lm_head.inner.weight", self._vocab(w))
                continue
            if name == "lm_head.weight":
                if self.model.lm_head is not None and not lay.cfg.tie_word_embeddings:
                    self._put("lm_head.inner.weight", self._vocab(w))
                continue
            if name == "norm.weight":
                self._put("norm.weight", w)
                continue
            m = _LAYER.fullmatch(name)
            if m is None:
                raise KeyError(f"unexpected weight {name!r} in the checkpoint")
            layer = int(m[1])
            if layer not in lay.layers:
                continue
            self._load_layer(f"layers.{layer - lay.layers.start}.", m[2], w)
        self._check_complete()

    def _load_layer(self, p: str, rest: str, w: torch.Tensor) -> None:
        lay = self.layout
        q, kv = lay.num_heads * lay.cfg.head_dim, lay.num_kv_heads * lay.cfg.head_dim
        ff = lay.intermediate
        qkv = p + "self_attn.qkv_proj.weight"
        gate_up = p + "mlp.gate_up_proj.weight"
        expert = _EXPERT.fullmatch(rest)
        if rest in ("input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate.weight"):
            self._put(p + rest, w)
        elif rest == "self_attn.q_proj.weight":
            self._put(qkv, self._q(w), slice(0, q))
        elif rest == "self_attn.k_proj.weight":
            self._put(qkv, self._kv(w), slice(q, q + kv))
        elif rest == "self_attn.v_proj.weight":
            self._put(qkv, self._kv(w), slice(q + kv, q + 2 * kv))
        elif rest == "self_attn.qkv_proj.weight":  # engine-fused (synthetic weights)
            full_q = lay.cfg.num_heads * lay.cfg.head_dim
            full_kv = lay.cfg.num_kv_heads * lay.cfg.head_dim
            wq, wk, wv = w.split([full_q, full_kv, full_kv])
            self._put(qkv, torch.cat([self._q(wq), self._kv(wk), self._kv(wv)]))
        elif rest == "self_attn.o_proj.weight":
            self._put(p + "self_attn.o_proj.inner.weight", self._q(w, dim=1))
        elif rest == "mlp.gate_proj.weight":
            self._put(gate_up, self._ff(w), slice(0, ff))
        elif rest == "mlp.up_proj.weight":
            self._put(gate_up, self._ff(w), slice(ff, 2 * ff))
        elif rest == "mlp.gate_up_proj.weight":
            gate, up = w.chunk(2)
            self._put(gate_up, torch.cat([self._ff(gate), self._ff(up)]))
        elif rest == "mlp.down_proj.weight":
            self._put(p + "mlp.down_proj.inner.weight", self._ff(w, dim=1))
        elif rest in ("mlp.w13", "mlp.w2"):  # engine-stacked experts (synthetic weights)
            for local in range(lay.num_local_experts):
                e = w[lay.first_expert + local]
                if rest == "mlp.w13":
                    gate, up = e.chunk(2)
                    self._put(p + "mlp.w13", torch.cat([self._ff(gate), self._ff(up)]), local)
                else:
                    self._put(p + "mlp.w2", self._ff(e, dim=1), local)
        elif expert:
            local = int(expert[1]) - lay.first_expert
            if not 0 <= local < lay.num_local_experts:
                return
            which = expert[2]
            if which == "w1":
                self._put(p + "mlp.w13", self._ff(w), (local, slice(0, ff)))
            elif which == "w3":
                self._put(p + "mlp.w13", self._ff(w), (local, slice(ff, 2 * ff)))
            else:
                self._put(p + "mlp.w2", self._ff(w, dim=1), local)
        else:
            raise KeyError(f"unexpected weight {p}{rest!r} in the checkpoint")

    def _check_complete(self) -> None:
        missing = [n for n in self.params if n not in self.loaded]
        if missing:
            raise KeyError(f"weights missing from the checkpoint for this shard: {missing[:8]}")


_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3)\.weight")


def synthetic_weights(spec: str) -> tuple[ModelConfig, object, Iterator[tuple[str, torch.Tensor]]]:
    """The same seeded tensors as `load_synthetic`, one full tensor at a time, engine-named."""
    from frota.engine.loader.synthetic import parse_spec
    from frota.engine.tokenizer import ByteTokenizer

    cfg, seed = parse_spec(spec)
    with torch.device("meta"):
        full = LlamaForCausalLM(cfg)
    if cfg.tie_word_embeddings:
        full.lm_head.weight = full.embed_tokens.weight
    shapes = [(n, tuple(p.shape)) for n, p in full.named_parameters()]

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed)
        for name, shape in shapes:
            if name.endswith("norm.weight"):
                yield name, 1.0 + 0.1 * torch.randn(shape, generator=gen)
            elif name == "embed_tokens.weight":
                yield name, torch.randn(shape, generator=gen)
            else:
                yield name, torch.randn(shape, generator=gen) / shape[-1] ** 0.5

    return cfg, ByteTokenizer(cfg.vocab_size), tensors()


def open_checkpoint(model_name: str) -> tuple[ModelConfig, object, Iterator[tuple[str, torch.Tensor]]]:
    """(full config, tokenizer, lazy iterator over the full tensors); reads no weights yet."""
    source = resolve_model(model_name)
    if source.kind == "synthetic":
        return synthetic_weights(source.path)
    if source.kind == "gguf":
        from gguf import GGUFReader

        from frota.engine.loader import gguf

        reader = GGUFReader(source.path)
        cfg = gguf.read_config(reader)
        return cfg, gguf.read_tokenizer(reader, cfg), gguf.iter_weights(reader, cfg, verbose=False)
    from frota.engine.loader import safetensors

    root = Path(source.path)
    cfg = safetensors.read_config(root)
    return (cfg, safetensors.read_tokenizer(root, cfg),
            safetensors.iter_weights(root, verbose=False))


def load_shard(cfg: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]], pc: ParallelConfig,
               comm: Comm, dtype: torch.dtype, device: torch.device,
               verbose: bool = True) -> tuple[LlamaForCausalLM, ShardLayout]:
    """(shard model, layout) for this rank, filled from the full tensors in `weights`."""
    model, layout = build_shard(cfg, pc, comm, dtype, device)
    ShardLoader(model, layout).load(weights)
    progress(verbose, f"rank {pc.rank}: loaded stage {pc.stage} layers "
                      f"{layout.layers.start}..{layout.layers.stop - 1}, tensor shard {pc.tp_rank}/{pc.tensor}, "
                      f"{shard_bytes(model) / 2**20:.1f} MiB of weights")
    return model, layout


def shard_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (a tied matrix counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total
