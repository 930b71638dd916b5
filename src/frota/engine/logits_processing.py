"""Per-request logit adjustments before sampling: logit_bias, min_tokens, and the
repetition / frequency / presence penalties.

Only the rows whose requests ask for one of these are touched (`needs_processing`), as
batched tensor ops over those rows; every other row of the logits is left as it was.
Order, as in vLLM: logit_bias, the min_tokens mask, then the penalties.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from frota.engine.sequence import Sequence


def needs_processing(seq: Sequence) -> bool:
    p = seq.params
    return bool(p.logit_bias or p.has_penalties
                or (p.min_tokens and seq.num_generated_tokens < p.min_tokens))


def _counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] float counts of each token id in each row."""
    width = max(1, max(len(r) for r in rows))
    # Pad with an extra column (id `vocab`) that is dropped afterwards.
    ids = torch.tensor([r + [vocab] * (width - len(r)) for r in rows], device=device)
    counts = torch.zeros(len(rows), vocab + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]


def process(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: Seq[int]) -> torch.Tensor:
    """logits [S, V] of exactly the rows of `seqs` (a gathered copy: it is adjusted in place)."""
    vocab = logits.shape[1]
    device = logits.device
    bias_rows, bias_ids, bias_values = [], [], []
    mask_rows, mask_ids = [], []
    for i, s in enumerate(seqs):
        p = s.params
        for token_id, bias in (p.logit_bias or {}).items():
            bias_rows.append(i)
            bias_ids.append(int(token_id))
            bias_values.append(float(bias))
        if p.min_tokens and s.num_generated_tokens < p.min_tokens:
            banned = {*eos_token_ids, *p.stop_token_ids}
            mask_rows.extend([i] * len(banned))
            mask_ids.extend(banned)
    if bias_rows:
        index = (torch.tensor(bias_rows, device=device), torch.tensor(bias_ids, device=device))
        logits.index_put_(index, torch.tensor(bias_values, device=device), accumulate=True)
    if mask_rows:
        index = (torch.tensor(mask_rows, device=device), torch.tensor(mask_ids, device=device))
        logits.index_put_(index, torch.tensor(float("-inf"), device=device))
    penalized = [i for i, s in enumerate(seqs) if s.params.has_penalties]
    if penalized:
        rows = torch.tensor(penalized, device=device)
        logits[rows] = _penalize(logits[rows], [seqs[i] for i in penalized], vocab)
    return logits


def _penalize(logits: torch.Tensor, seqs: list[Sequence], vocab: int) -> torch.Tensor:
    device = logits.device

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=logits.dtype, device=device).unsqueeze(1)

    output_counts = _counts([s.generated_token_ids for s in seqs], vocab, device)
    repetition = [s.params.repetition_penalty for s in seqs]
    if any(r != 1.0 for r in repetition):
        # HF/vLLM: over prompt and output; positive logits are divided, negative multiplied.
        prompt_counts = _counts([s.token_ids[: s.num_prompt_tokens] for s in seqs], vocab, device)
        seen = (prompt_counts + output_counts) > 0
        penalty = column(repetition).expand_as(logits)
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, scaled, logits)
    # OpenAI: over the generated tokens only.
    logits = logits - column([s.params.frequency_penalty for s in seqs]) * output_counts
    return logits - column([s.params.presence_penalty for s in seqs]) * (output_counts > 0)
