"""Perplexity through the engine's own paged forward pass (windows of the text, no overlap)."""

from __future__ import annotations

import math

import torch

from frota.engine.llm_engine import LLMEngine
from frota.engine.sampling_params import SamplingParams
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence


@torch.inference_mode()
def perplexity(engine: LLMEngine, text: str, window: int | None = None,
               max_tokens: int | None = None) -> tuple[float, int]:
    """(perplexity, number of predicted tokens) of `text` under the engine's model."""
    ids = engine.tokenizer.encode(text)
    if max_tokens:
        ids = ids[: max_tokens + 1]
    window = min(window or 1024, engine.max_model_len)
    bm = engine.block_manager
    runner = engine.runner
    nll = 0.0
    count = 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window + 1]
        inputs, targets = chunk[:-1], chunk[1:]
        seq = Sequence("ppl", inputs, SamplingParams(max_tokens=1))
        batch = ScheduledBatch()
        step = engine.scheduler.max_num_batched_tokens
        for offset in range(0, len(inputs), step):
            n = min(step, len(inputs) - offset)
            bm.append_slots(seq, n)
            batch = ScheduledBatch([seq], [n])
            input_ids, positions, meta, _, _ = runner.prepare(batch)
            hidden = runner.model(input_ids, positions, runner.kv_caches, meta)
            logits = runner.model.compute_logits(hidden)
            target = torch.tensor(targets[offset : offset + n], device=logits.device)
            nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            count += n
            seq.num_computed_tokens += n
        bm.deallocate(seq)
    return math.exp(nll / max(count, 1)), count
