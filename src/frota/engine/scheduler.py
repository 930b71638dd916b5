"""Continuous batching under a token budget, with chunked prefill and preemption by recompute.

State is two queues, `waiting` and `running`. Each step, running sequences go
first (a decode costs one token, an unfinished prefill the rest of its prompt up
to the budget); whatever budget is left admits waiting sequences, whose prompts
may be split over several steps. When the pool runs out of blocks, the most
recently admitted running sequence is preempted: its blocks are freed and it
goes back to the front of `waiting`, to be recomputed later.

LoRA: admitting a sequence under an adapter pins a slot for it (`LoRAManager.acquire`);
finishing or preemption unpins it. When every slot is pinned by other adapters the
sequence is skipped, not waited on: base-model requests behind it are still admitted. Other
adapters' requests behind it are not, so the pinned slots drain and it gets the next idle
one (no starvation); running sequences always finish, so this cannot deadlock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from frota.engine.block_manager import BlockManager
from frota.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from frota.engine.lora.manager import LoRAManager


@dataclass
class ScheduledBatch:
    """What one step computes: for each sequence, how many of its next tokens."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    """Decides, step by step, which tokens of which sequences to compute."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        lora: LoRAManager | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.lora = lora
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Keep a few blocks spare when admitting, so new prompts do not immediately
        # force the running sequences into preemption.
        self.admission_watermark = max(1, block_manager.num_blocks // 100)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        bm = self.block_manager
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            if n == 0:
                i += 1
                continue
            while not bm.can_append(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                bm.append_slots(seq, n)
                bm.register_computed_blocks(seq, seq.num_computed_tokens + n)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
        waiting_for_slot = False  # a sequence ahead is waiting for an adapter slot
        i = 0
        while (
            not preempted
            and i < len(self.waiting)
            and budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[i]
            if seq.adapter is not None and (waiting_for_slot or not self._pin_adapter(seq)):
                waiting_for_slot = True
                i += 1
                continue
            first_admission = seq.num_preemptions == 0
            num_hit = bm.allocate_cached_prefix(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            spare = self.admission_watermark if self.running else 0
            if bm.num_blocks_needed(seq, n) > bm.num_free_blocks - spare:
                bm.deallocate(seq)
                self._unpin_adapter(seq)
                break
            if first_admission:
                seq.num_cached_tokens = num_hit
                bm.record_prefix_query(seq.num_prompt_tokens, num_hit)
            bm.append_slots(seq, n)
            bm.register_computed_blocks(seq, seq.num_computed_tokens + n)
            del self.waiting[i]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

    def _pin_adapter(self, seq: Sequence) -> bool:
        if not seq.holds_slot:
            if self.lora is None or not self.lora.acquire(seq.adapter):
                return False
            seq.holds_slot = True
        return True

    def _unpin_adapter(self, seq: Sequence) -> None:
        if seq.holds_slot:
            seq.holds_slot = False
            self.lora.release(seq.adapter)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        self._unpin_adapter(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def postprocess(self, batch: ScheduledBatch) -> list[Sequence]:
        """Advance computed counts; return the sequences whose next token was just sampled."""
        completed = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.block_manager.register_computed_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                completed.append(seq)
        return completed

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark a sequence finished and give its blocks back at once."""
        if seq.status == SequenceStatus.FINISHED:
            return
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._unpin_adapter(seq)
        if not seq.keep_kv:  # pinned blocks are freed by frota.engine.kv_transfer
            self.block_manager.deallocate(seq)
