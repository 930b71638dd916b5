"""How large the KV cache is: its blocks, from an explicit count, a byte budget, or a share of
the memory left once the weights and the adapter slots are in place (so it is sized after
them), and the longest sequence those blocks can hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from frota.api.memory import kv_bytes_per_token
from frota.engine.config import EngineArgs, ModelConfig
from frota.engine.progress import progress

_DEFAULT_CPU_KV_FRACTION = 0.2
_DEFAULT_CPU_KV_CAP = 1 << 30  # several workers often share one host on CPU
_DEFAULT_GPU_KV_FRACTION = 0.85


@dataclass(frozen=True)
class KVCacheSize:
    num_blocks: int
    max_model_len: int  # the model's window, lowered where the blocks hold less


def _available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0] * _DEFAULT_GPU_KV_FRACTION)
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return min(int(info.get("MemAvailable", 8 << 30) * _DEFAULT_CPU_KV_FRACTION), _DEFAULT_CPU_KV_CAP)


def num_kv_blocks_for(args: EngineArgs, cfg: ModelConfig, dtype: torch.dtype,
                      device: torch.device, max_model_len: int) -> int:
    """Blocks from an explicit count, a byte budget, or a share of the memory that is left."""
    per_token = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                   args.kv_cache_dtype, str(dtype).removeprefix("torch."))
    bytes_per_block = per_token * args.block_size
    if args.num_kv_blocks is not None:
        return args.num_kv_blocks
    if args.kv_cache_memory is not None:
        return int(args.kv_cache_memory // bytes_per_block)
    # More than every sequence at full length is never useful.
    enough = args.max_num_seqs * -(-max_model_len // args.block_size)
    return max(1, min(_available_memory(device) // bytes_per_block, enough))


def size_kv_cache(args: EngineArgs, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                  agree: Callable[[int], int] | None = None) -> KVCacheSize:
    """The KV cache of a model of config `cfg` (a sharded rank's own: its KV heads and
    layers). `agree`: a sharded engine's smallest count over its ranks, which every rank
    takes (block ids are rank 0's, so every rank needs as many)."""
    max_model_len = min(args.max_model_len or cfg.max_position, cfg.max_position)
    num_blocks = num_kv_blocks_for(args, cfg, dtype, device, max_model_len)
    if agree is not None:
        num_blocks = agree(num_blocks)
    if num_blocks < 1:
        raise ValueError("the KV cache budget is smaller than one block")
    if num_blocks * args.block_size < max_model_len:
        # One sequence must always fit alone, or preemption could not guarantee progress.
        max_model_len = num_blocks * args.block_size
        progress(args.verbose, f"max_model_len lowered to {max_model_len} to fit the KV cache")
    return KVCacheSize(num_blocks, max_model_len)
