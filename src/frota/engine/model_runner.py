"""Runs one scheduled batch through the model: builds the flat inputs and attention metadata,
owns the KV pool, and returns logits only for the sequences that sample this step."""

from __future__ import annotations

import torch

from frota.engine import prompt_logprobs
from frota.engine.attention import AttentionMetadata, PrefillSpan
from frota.engine.config import ModelConfig
from frota.engine.lora.batch import build_batch
from frota.engine.lora.layers import applying
from frota.engine.lora.manager import LoRAManager
from frota.engine.quant.kv import allocate_kv_pool
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence


class ModelRunner:
    """The model plus its KV pool (one `[num_blocks, kv_heads, block_size, head_dim]` pair per layer)."""

    def __init__(self, model, cfg: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto",
                 lora: LoRAManager | None = None) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        self.device = device
        self.dtype = dtype
        self.lora = lora  # the adapter slots, when LoRA is on
        shape = (num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)
        ] if kv_cache_dtype == "auto" else allocate_kv_pool(
            cfg.num_layers, *shape, kv_cache_dtype=kv_cache_dtype, dtype=dtype, device=device)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def prepare(self, batch: ScheduledBatch,
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int], list[Sequence]]:
        """Order decodes first, then prefill chunks; return model inputs and who samples."""
        bs = self.block_size
        items = self.ordered(batch)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSpan] = []
        lora_rows: list[tuple[int, int, int | None]] = []
        logits_rows: list[int] = []
        sampling_seqs: list[Sequence] = []
        num_decodes = 0
        for seq, n in items:
            start = seq.num_computed_tokens
            end = start + n
            table = seq.block_table
            row = len(input_ids)
            lora_rows.append((row, n, seq.lora_slot))
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            num_blocks = -(-end // bs)
            if n == 1:
                decode_tables.append(table[:num_blocks])
                decode_lens.append(end)
                num_decodes += 1
            else:
                block_table = self._tensor(table[:num_blocks]) if start > 0 else None
                prefills.append(PrefillSpan(row, n, end, block_table))
            if end == seq.num_tokens:
                logits_rows.append(row + n - 1)
                sampling_seqs.append(seq)
        slot_t = self._tensor(slots)
        meta = AttentionMetadata(
            slot_blocks=slot_t // bs, slot_offsets=slot_t % bs, num_decodes=num_decodes,
            prefills=prefills,
            lora=build_batch(lora_rows, self.device) if self.lora is not None else None,
        )
        if num_decodes:
            width = max(len(t) for t in decode_tables)
            meta.decode_block_tables = torch.tensor(
                [t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.int32, device=self.device)
            meta.decode_context_lens = torch.tensor(decode_lens, dtype=torch.int32, device=self.device)
        return self._tensor(input_ids), self._tensor(positions), meta, logits_rows, sampling_seqs

    @staticmethod
    def ordered(batch: ScheduledBatch) -> list[tuple[Sequence, int]]:
        """(seq, new tokens) in the order of the model's input rows: decodes first."""
        return sorted(zip(batch.seqs, batch.num_new_tokens, strict=True), key=lambda x: x[1] != 1)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor | None, list[Sequence]]:
        """Compute the batch; return (logits [S, vocab] float32, the S sequences they belong to)."""
        input_ids, positions, meta, logits_rows, seqs = self.prepare(batch)
        with applying(self.model, self.lora and self.lora.pool, meta.lora):
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
        scored = prompt_logprobs.spans(self.ordered(batch))
        if scored:  # only requests that asked for prompt logprobs (echo)
            prompt_logprobs.record(scored, hidden, self.model.compute_logits)
        if not logits_rows:
            return None, []
        logits = self.model.compute_logits(hidden[self._tensor(logits_rows)])
        return logits, seqs
