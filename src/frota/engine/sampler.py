"""Token choice per row: greedy, or temperature / top-k / top-p sampling with per-request seeds."""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from frota.engine import grammar, kernels, logits_processing
from frota.engine.outputs import TokenLogprob
from frota.engine.sequence import Sequence


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token (the first on ties). On the CPU a C++ kernel does it:
    torch's argmax reads a [64, 49152] batch of logits at about 3 GB/s, a twentieth of a
    decode step of a small model."""
    ops = kernels.for_tensor(logits)
    if ops is not None and logits.dtype == torch.float32 and logits.is_contiguous():
        return ops.argmax_rows(logits)
    return logits.argmax(dim=-1)


class Sampler:
    """Samples one token per row of logits. Each seeded request draws from its own generator,
    so its output does not depend on what else is in the batch."""

    def __init__(self, seed: int, eos_token_ids: Seq[int] = ()) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.eos_token_ids = tuple(eos_token_ids)  # what min_tokens masks

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor,
                 seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits: [S, V] float32. Returns (token ids, logprobs per row or None).
        Logprobs are the model's own (before logit_bias and penalties), as vLLM reports them."""
        logits = raw_logits = logits.float()
        processed = [i for i, s in enumerate(seqs) if logits_processing.needs_processing(s)]
        if processed:
            rows = torch.tensor(processed, device=logits.device)
            logits = logits.index_put((rows,), logits_processing.process(
                logits[rows], [seqs[i] for i in processed], self.eos_token_ids))
        if any(s.matcher is not None for s in seqs):  # last, so no bias can unmask a token
            logits = logits.clone() if logits is raw_logits else logits
            grammar.mask_constrained(logits, seqs)
        tokens = greedy(logits)
        sampled_rows = [i for i, s in enumerate(seqs) if not s.params.is_greedy]
        if sampled_rows:
            rows = torch.tensor(sampled_rows, device=logits.device)
            picked = self._sample(logits[rows], [seqs[i] for i in sampled_rows])
            tokens[rows] = picked
        token_list = tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        wanted = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if wanted:
            lp = torch.log_softmax(raw_logits[wanted], dim=-1)
            for j, i in enumerate(wanted):
                n = seqs[i].params.logprobs or 0
                top = lp[j].topk(n) if n else None
                logprobs[i] = TokenLogprob(
                    token_list[i], float(lp[j, token_list[i]]),
                    dict(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top else {},
                )
        return token_list, logprobs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        temps = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
        logits = logits / temps.unsqueeze(1)
        needs_sort = any((s.params.top_k or 0) > 0 or s.params.top_p < 1 for s in seqs)
        if needs_sort:
            logits, order = logits.sort(dim=-1, descending=True)
            vocab = logits.shape[1]
            ks = torch.tensor([s.params.top_k if (s.params.top_k or 0) > 0 else vocab for s in seqs])
            ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
            logits = logits.masked_fill(ranks >= ks.unsqueeze(1).to(logits.device), float("-inf"))
            probs = logits.softmax(dim=-1)
            top_ps = torch.tensor([s.params.top_p for s in seqs], device=logits.device)
            # Drop a token when the tokens ranked above it already reach top_p.
            outside = (probs.cumsum(dim=-1) - probs) >= top_ps.unsqueeze(1)
            probs = probs.masked_fill(outside, 0.0)
        else:
            probs = logits.softmax(dim=-1)
        cdf = probs.cumsum(dim=-1)
        draws = torch.stack([
            torch.rand((), generator=s.generator or self.generator) for s in seqs
        ]).to(logits.device)
        picked = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1)).squeeze(1)
        picked = picked.clamp(max=cdf.shape[1] - 1)
        if needs_sort:
            picked = order.gather(1, picked.unsqueeze(1)).squeeze(1)
        return picked
