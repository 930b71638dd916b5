"""Prompt logprobs (completions `echo` + `logprobs`): the log-softmax at every prompt position.

Only requests with `params.prompt_logprobs` set pay for it. The model runner hands the
hidden states of each prefill chunk here; position p scores prompt token p + 1. Chunked
prefill fills `seq.prompt_logprobs` chunk by chunk; a recompute after preemption finds
those positions already scored and skips them. Such requests bypass the prefix cache
(`BlockManager.allocate_cached_prefix`), since a cache hit skips computing positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from frota.engine.outputs import TokenLogprob
from frota.engine.sequence import Sequence


@dataclass
class Span:
    """Rows [row, row + count) of the step's hidden states are positions [pos, pos + count)."""

    seq: Sequence
    row: int
    pos: int
    count: int


def spans(items: list[tuple[Sequence, int]]) -> list[Span]:
    """The prompt positions still to score in a step; `items`: (seq, new tokens) in row order."""
    result: list[Span] = []
    row = 0
    for seq, n in items:
        if seq.params.prompt_logprobs is not None:
            start = seq.num_computed_tokens
            first = max(start, len(seq.prompt_logprobs) - 1)
            last = min(start + n, seq.num_prompt_tokens - 1)  # the last prompt position samples
            if first < last:
                result.append(Span(seq, row + first - start, first, last - first))
        row += n
    return result


def record(found: list[Span], hidden: torch.Tensor,
           compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Append each span's scores to its sequence's `prompt_logprobs`."""
    for span in found:
        seq = span.seq
        logprobs = compute_logits(hidden[span.row : span.row + span.count]).float().log_softmax(-1)
        targets = seq.token_ids[span.pos + 1 : span.pos + 1 + span.count]
        target_t = torch.tensor(targets, device=logprobs.device).unsqueeze(1)
        chosen = logprobs.gather(1, target_t).squeeze(1).tolist()
        n = seq.params.prompt_logprobs or 0
        if n:
            top = logprobs.topk(n, dim=-1)
            tops = [dict(zip(i, v, strict=True))
                    for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)]
        else:
            tops = [{} for _ in targets]
        seq.prompt_logprobs.extend(
            TokenLogprob(t, lp, top) for t, lp, top in zip(targets, chosen, tops, strict=True))
