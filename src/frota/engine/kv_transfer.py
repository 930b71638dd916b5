"""Moving a sequence's prompt KV between engines (disaggregated prefill/decode).

Prefill side: a sequence built with `keep_kv = True` keeps its blocks when it
finishes (the scheduler skips `deallocate`); `export_parts` reads those blocks
layer by layer as raw bytes; `release` frees them (on the engine thread).

Decode side: `reserve` allocates fresh blocks for a new sequence whose token ids
are the prompt plus the first token the prefill engine sampled; `import_part`
copies received bytes into them; `admit_imported` hands the sequence to the
scheduler with the prompt already computed, so the next step computes only the
first token and samples the second, exactly as the colocated engine would.

LoRA: the header names the adapter the prefill ran under (`adapter`, None for the base
model); the decode side builds its sequence under the same name (`new_sequence(adapter=)`,
which fails if it is not loaded there) and `check_adapter` refuses KV of another adapter.

Both sides describe their KV pool with `layout_fingerprint`; a transfer between
pools whose fingerprints differ is refused (the bytes would be meaningless).

`KVTransfer` is the same, bound to a running engine (`AsyncEngine.kv_transfer`):
what the worker's HTTP routes use, so they never reach into the engine's block pool
or a sequence's bookkeeping.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import torch

from frota.engine.llm_engine import LLMEngine
from frota.engine.lora.errors import AdapterError
from frota.engine.outputs import RequestOutput
from frota.engine.sampling_params import SamplingParams
from frota.engine.sequence import Sequence

# Runs a function on the engine thread between steps and returns its result (`AsyncEngine.call`).
OnEngineThread = Callable[[Callable[[LLMEngine], Any]], Awaitable[Any]]


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


def adapter_name(seq: Sequence) -> str | None:
    """The LoRA adapter a sequence runs under (None: the base model), as a handle names it."""
    return seq.adapter.name if seq.adapter is not None else None


def check_adapter(header: dict[str, Any], seq: Sequence) -> None:
    """The decode side: the prefill's KV must be its adapter's (see `KVTransfer.check_adapter`)."""
    sent, here = header.get("adapter"), adapter_name(seq)
    if sent != here:
        raise AdapterError(f"the KV handed over was computed under adapter {sent!r}, but this "
                           f"request runs under {here!r}: send both sides the same model",
                           "invalid_adapter")


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
    output of that first token, through the same detokenizer and stop rule as `step`."""
    engine.add_sequence(seq)
    seq.first_token_time = time.perf_counter()
    return engine.emit(seq)


class KVTransfer:
    """A running engine's side of a KV transfer: `engine` steps in its own thread, and
    `on_engine_thread` runs a function there between steps (`AsyncEngine.call`).

    Block pool changes (`reserve`, `release`) run on the engine thread; reading pinned
    blocks and writing reserved ones run on the caller's (no step touches those blocks).
    """

    def __init__(self, engine: LLMEngine, on_engine_thread: OnEngineThread) -> None:
        self._engine = engine
        self._call = on_engine_thread

    def layout(self) -> dict[str, Any]:
        return layout(self._engine)

    def fingerprint(self) -> str:
        return layout_fingerprint(self._engine)

    @staticmethod
    def prompt_digest(token_ids: list[int]) -> str:
        return prompt_digest(token_ids)

    def num_parts(self) -> int:
        """Storage parts of a block stream (per layer K then V; values and scales if quantized)."""
        return len(storage_parts(self._engine))

    def new_sequence(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                     *, keep_kv: bool = False, adapter: str | None = None) -> Sequence:
        """A validated sequence for `AsyncEngine.generate(seq=...)`; raises InvalidRequestError,
        or AdapterError when `adapter` (a LoRA adapter's name) is not loaded here.
        `keep_kv`: a prefill whose blocks stay pinned after it finishes, for `export`."""
        seq = self._engine.make_sequence(request_id, prompt, params, adapter)
        seq.keep_kv = keep_kv
        return seq

    # -- prefill side ----------------------------------------------------------

    def export(self, seq: Sequence) -> tuple[dict[str, Any], Iterator[memoryview]]:
        """The stream header (fingerprint, layout, num_prompt_tokens, num_blocks, parts) of a
        finished prefill's pinned prompt blocks, and their bytes part by part (read lazily)."""
        num_blocks = -(-seq.num_prompt_tokens // self._engine.block_manager.block_size)
        header = {"fingerprint": self.fingerprint(), "layout": self.layout(),
                  "num_prompt_tokens": seq.num_prompt_tokens, "num_blocks": num_blocks,
                  "adapter": adapter_name(seq),
                  "parts": part_specs(self._engine, num_blocks)}
        return header, export_parts(self._engine, list(seq.block_table[:num_blocks]))

    async def release(self, seq: Sequence) -> None:
        """Free a pinned or reserved sequence's blocks; raises RuntimeError if the engine stopped."""
        await self._call(lambda e: release(e, seq))

    # -- decode side -----------------------------------------------------------

    @staticmethod
    def check_adapter(header: dict[str, Any], seq: Sequence) -> None:
        """Raise AdapterError unless the KV in `header` was computed under the adapter `seq`
        runs under (both None: the base model); KV under one adapter never serves another."""
        check_adapter(header, seq)

    def holds_blocks(self, seq: Sequence) -> bool:
        return bool(seq.block_table)

    async def reserve(self, seq: Sequence) -> bool:
        """Blocks for `seq`'s prompt; False when the pool cannot spare them (the engine will
        then compute the prompt itself)."""
        num_tokens = seq.num_prompt_tokens
        return bool(await self._call(lambda e: reserve(e, seq, num_tokens)))

    def import_part(self, seq: Sequence, part_index: int, data: bytes | bytearray,
                    spec: dict[str, Any]) -> None:
        """Copy one received part into `seq`'s reserved blocks."""
        import_part(self._engine, part_index, seq.block_table, data, spec)

    def finish_import(self, seq: Sequence, first_token: int) -> None:
        """The prompt's KV is in place (if blocks were reserved) and the prefill's first token
        follows it: `generate(seq=seq)` then continues from the second token."""
        if seq.block_table:
            seq.num_computed_tokens = seq.num_prompt_tokens
        seq.append_token(first_token)
