"""Moving a sequence's prompt KV between engines (disaggregated prefill/decode).

Prefill side: a sequence built with `keep_kv = True` keeps its blocks when it
finishes (the scheduler skips `deallocate`); `export_parts` reads those blocks
layer by layer as raw bytes; `release` frees them (on the engine thread).

Decode side: `reserve` allocates fresh blocks for a new sequence whose token ids
are the prompt plus the first token the prefill engine sampled; `import_part`
copies received bytes into them; `admit_imported` hands the sequence to the
scheduler with the prompt already computed, so the next step computes only the
first token and samples the second, exactly as the colocated engine would.

Both sides describe their KV pool with `layout_fingerprint`; a transfer between
pools whose fingerprints differ is refused (the bytes would be meaningless).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import torch

from frota.engine.llm_engine import LLMEngine
from frota.engine.outputs import RequestOutput
from frota.engine.sequence import Sequence


def layout(engine: LLMEngine) -> dict[str, Any]:
    """What must match for KV bytes to mean the same thing in two pools."""
    cfg = engine.model_config
    args = engine.args
    return {
        "model": args.model, "quantization": args.quantization,
        "dtype": str(engine.dtype).removeprefix("torch."), "kv_cache_dtype": args.kv_cache_dtype,
        "block_size": args.block_size, "num_layers": cfg.num_layers,
        "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
    }


def layout_fingerprint(engine: LLMEngine) -> str:
    """A short, stable digest of `layout(engine)`."""
    text = json.dumps(layout(engine), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_digest(token_ids: list[int]) -> str:
    """Both sides tokenize the request themselves; this proves they got the same ids."""
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


def storage_parts(engine: LLMEngine) -> list[torch.Tensor]:
    """Every tensor of the KV pool whose first dimension is the block, in a fixed order:
    per layer K then V; a quantized cache contributes its values and its scales."""
    parts: list[torch.Tensor] = []
    for k_cache, v_cache in engine.runner.kv_caches:
        for cache in (k_cache, v_cache):
            if isinstance(cache, torch.Tensor):
                parts.append(cache)
            else:  # QuantizedKVCache
                parts.extend((cache.values, cache.scales))
    return parts


def part_specs(engine: LLMEngine, num_blocks: int) -> list[dict[str, Any]]:
    """Shape, dtype and byte count of each part for `num_blocks` blocks (the frame header)."""
    specs = []
    for part in storage_parts(engine):
        shape = [num_blocks, *part.shape[1:]]
        nbytes = part.element_size() * int(torch.Size(shape).numel())
        specs.append({"shape": shape, "dtype": str(part.dtype).removeprefix("torch."),
                      "nbytes": nbytes})
    return specs


def export_parts(engine: LLMEngine, block_ids: list[int]) -> Iterator[memoryview]:
    """The raw bytes of each storage part, restricted to `block_ids`, one part at a time.

    Safe off the engine thread: pinned blocks are never written by the engine.
    """
    index = torch.tensor(block_ids, dtype=torch.long)
    for part in storage_parts(engine):
        with torch.no_grad():
            chunk = part.index_select(0, index.to(part.device)).contiguous().cpu()
        yield memoryview(chunk.view(torch.uint8).numpy()).cast("B")


def import_part(engine: LLMEngine, part_index: int, block_ids: list[int], data: bytes | bytearray,
                spec: dict[str, Any]) -> None:
    """Copy one received part into the blocks `block_ids` reserved by `reserve`."""
    part = storage_parts(engine)[part_index]
    dtype = getattr(torch, spec["dtype"])
    if dtype != part.dtype or list(spec["shape"][1:]) != list(part.shape[1:]):
        raise ValueError(f"part {part_index}: {spec['dtype']}{spec['shape'][1:]} does not fit "
                         f"{part.dtype}{list(part.shape[1:])}")
    buf = data if isinstance(data, bytearray) else bytearray(data)
    src = torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(spec["shape"])
    index = torch.tensor(block_ids, dtype=torch.long, device=part.device)
    with torch.no_grad():
        part.index_copy_(0, index, src.to(part.device))


def reserve(engine: LLMEngine, seq: Sequence, num_tokens: int) -> bool:
    """Engine thread: give `seq` blocks for its first `num_tokens` tokens; False when the
    pool cannot spare them (the caller then lets the engine recompute the prompt)."""
    bm = engine.block_manager
    needed = bm.num_blocks_needed(seq, num_tokens)
    if needed > bm.num_free_blocks - engine.scheduler.admission_watermark:
        return False
    bm.append_slots(seq, num_tokens)
    return True


def release(engine: LLMEngine, seq: Sequence) -> None:
    """Engine thread: free a pinned or reserved sequence's blocks."""
    seq.keep_kv = False
    engine.block_manager.deallocate(seq)


def admit_imported(engine: LLMEngine, seq: Sequence) -> RequestOutput:
    """Engine thread: schedule `seq` (prompt KV imported, first token appended) and return the
    output of that first token, through the same detokenizer and stop checks as `step`."""
    engine.add_sequence(seq)
    detok = engine.requests[seq.request_id][1]
    token = seq.token_ids[-1]
    seq.first_token_time = time.perf_counter()
    reason = ("stop" if detok.add(token)
              else engine.scheduler.check_stop_tokens(seq, engine.tokenizer.eos_token_ids))
    if reason is not None:
        engine.scheduler.finish(seq, reason)
        del engine.requests[seq.request_id]
    text = detok.flush(finished=reason is not None)
    return engine._output(seq, [token], text, None, reason is not None)
