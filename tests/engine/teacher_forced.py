"""Teacher-forced comparison of two numeric paths: the same token sequences through both, the
logits of every position compared.

Counting identical free-running greedy continuations judges two paths by chance: one near-tie
flips a token, and the rest of that continuation diverges, so whether 4 or 5 of 8 survive
depends on the CPU. Teacher forcing feeds both paths the same tokens (a prompt, then a fixed
continuation), so each position is judged on its own: its argmax agrees or not, its logits
differ by so much, and one flip costs one position, not the rest of the sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from frota.api.memory import ModelShape
from frota.engine.llm_engine import LLMEngine
from frota.engine.sampling_params import SamplingParams
from frota.engine.scheduler import ScheduledBatch
from frota.engine.sequence import Sequence


@torch.inference_mode()
def teacher_forced_logits(engine: LLMEngine, prompts: list[list[int]],
                          continuations: list[list[int]]) -> list[torch.Tensor]:
    """For each prompt + continuation, the float32 logits [len(continuation), vocab] that
    predict the continuation's tokens. Each prompt is one prefill chunk and each continuation
    token one decode step, all sequences batched, as a generation runs: the decode steps read
    the KV cache (its dtype, e.g. int8, is part of the path compared)."""
    runner, bm = engine.runner, engine.block_manager
    seqs = [Sequence(f"tf{i}", p + c, SamplingParams(max_tokens=1))
            for i, (p, c) in enumerate(zip(prompts, continuations, strict=True))]
    rows: list[list[torch.Tensor]] = [[] for _ in seqs]

    def step(chunks: list[tuple[int, int]]) -> None:  # (sequence index, tokens)
        batch = ScheduledBatch([seqs[i] for i, _ in chunks], [n for _, n in chunks])
        for i, n in chunks:
            bm.append_slots(seqs[i], n)
        input_ids, positions, meta, _, _ = runner.prepare(batch)
        hidden = runner.model(input_ids, positions, runner.kv_caches, meta)
        # prepare() orders decodes first; each chunk's last row predicts its next token
        row = 0
        for seq, n in runner.ordered(batch):
            index = seqs.index(seq)
            rows[index].append(runner.model.compute_logits(hidden[row + n - 1 : row + n]).float())
            row += n
            seq.num_computed_tokens += n

    try:
        step([(i, len(p)) for i, p in enumerate(prompts)])
        for t in range(max(map(len, continuations)) - 1):
            step([(i, 1) for i, c in enumerate(continuations) if t < len(c) - 1])
    finally:
        for seq in seqs:
            bm.deallocate(seq)
    return [torch.cat(r)[: len(c)] for r, c in zip(rows, continuations, strict=True)]


def greedy(engine: LLMEngine, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """Free-running greedy continuations (the sequences the comparisons force)."""
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"g{i}", p, params)
    out: dict[str, list[int]] = {f"g{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished:
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return [out[f"g{i}"] for i in range(len(prompts))]


@dataclass(frozen=True)
class Format:
    """How far a numeric path may move float32's logits, derived from what it rounds.

    A storage format (bfloat16 weights and activations, an int8 or fp8 KV cache) rounds each
    value it stores by at most `unit` of it (of its group's largest, for absmax formats). To
    first order, each of a model's L layers adds such a relative change to the residual stream,
    so the logits move by at most about L * unit * max|z| (`logit_bound`, max|z| the largest
    reference logit). float32 paths that hold the same weights (oneDNN-packed against F.linear,
    int4 GGUF weights against their float32 dequantization) only sum in other orders: a dot
    product of K terms then differs by about sqrt(K) roundings (`summation` True).

    A flip of the argmax needs the two top logits to move by more than their margin.
    - float32 in other orders (`flip_rate` None): the rounding is so small that a flip is
      allowed only where the reference's margin is below twice the bound (`near_tie`, a few
      thousandths of a logit on SmolLM2): a per-position rule, never a flip elsewhere.
    - A storage format: its worst case (`logit_bound`, L units) covers every position, and a
      band of one unit either side (`near_tie`) holds a quarter of them; which of those flip
      depends on each position's own noise, so no per-position rule tells a bug from it.
      Instead a format may flip at most FLIP_MARGIN times `flip_rate`, the highest rate
      measured on any kernel path, of the positions:

      | format | flips / positions, worst run | near-ties | runs |
      |---|---|---|---|
      | bfloat16 | 1/48 (no C++ kernels); 5/256 | 11/48, 65/256 | 7, 0 to 5 flips |
      | int8 KV | 2/48 (no C++ kernels, prebuilt v2 and v3); 4/256 | 12/48, 70/256 | 8 |
      | fp8 KV | 0/48, so the rule of three's 3/48 | 38/48 | 1 (synthetic) |
      | float32 orders | 0 in 1,376 positions | 0 | 20 |

      Measured on SmolLM2 (48 positions under each kernel switch of test_numeric_paths, 256
      in test_smollm2_quant) and the synthetic models (test_engine_quant), on an AMD x86-64-v3
      CPU without AVX-512 or AMX; FLIP_MARGIN leaves room for the paths not measured there. A
      format that flipped ten times as often fails, where a rule of "no more flips than
      near-ties" (a quarter of the positions) would pass it.

    log-softmax moves by at most twice the largest logit change, so the perplexity ratio is
    within exp(2 * logit_bound); zero-mean rounding moves an average far less than that, so
    the bar is also `ppl_cap`.
    """

    name: str
    unit: float
    ppl_cap: float
    flip_rate: Fraction | None  # the most argmax flips per position measured (the table)
    summation: bool = False

    def logit_bound(self, max_logit: float, num_layers: int, max_k: int) -> float:
        growth = math.sqrt(max_k) if self.summation else 1.0
        return num_layers * growth * self.unit * max_logit

    def near_tie(self, max_logit: float, num_layers: int, max_k: int) -> float:
        if self.summation:  # differences this small decide nothing but exact ties
            return 2 * self.logit_bound(max_logit, num_layers, max_k)
        return 2 * self.unit * max_logit

    def max_flips(self, num_positions: int) -> int:
        assert self.flip_rate is not None
        return math.ceil(FLIP_MARGIN * self.flip_rate * num_positions)

    def max_ppl_ratio(self, max_logit: float, num_layers: int, max_k: int) -> float:
        return min(self.ppl_cap, math.exp(2 * self.logit_bound(max_logit, num_layers, max_k)))


# A storage format's flips: at most this many times the rate it flipped at when measured
FLIP_MARGIN = 3
# ppl_cap 1%: the usual bar for a format served as lossless; fp8's 4 bits get 5%
FLOAT32_ORDER = Format("float32, other summation orders", 2.0**-24, 1.01, flip_rate=None,
                       summation=True)
BFLOAT16 = Format("bfloat16 (8 significant bits)", 2.0**-8, 1.01, flip_rate=Fraction(1, 48))
# absmax / 127 per (token, head) row: half a step is 1/254 of the row's largest value, plus
# the float16 rounding of the scale (2^-11)
INT8_KV = Format("int8 KV cache (absmax per row)", 1 / 254 + 2.0**-11, 1.01,
                 flip_rate=Fraction(2, 48))
FP8_KV = Format("fp8 e4m3 KV cache (4 significant bits)", 2.0**-4, 1.05, flip_rate=Fraction(3, 48))


@dataclass(frozen=True)
class Agreement:
    """How another path's teacher-forced logits compare with the reference's, position by
    position, over the same forced tokens."""

    margins: torch.Tensor  # the reference's top-1 minus top-2 logit, per position
    agree: torch.Tensor  # whether the argmax agrees, per position
    max_logit: float  # the largest |reference logit|
    max_logit_diff: float  # the largest |difference| of any logit at any position
    ppl_ratio: float  # perplexity of the forced tokens, other / reference

    @property
    def num_flips(self) -> int:
        return int((~self.agree).sum())

    def __str__(self) -> str:
        flips = self.margins[~self.agree]
        worst = f", largest flipped margin {flips.max().item():.3g}" if len(flips) else ""
        return (f"{self.num_flips} flips over {len(self.agree)} positions{worst}, max |logit "
                f"diff| {self.max_logit_diff:.3g} (max |logit| {self.max_logit:.3g}), perplexity "
                f"ratio {self.ppl_ratio:.4f}")


def compare(reference: list[torch.Tensor], other: list[torch.Tensor],
            forced: list[list[int]]) -> Agreement:
    """`reference` and `other`: teacher-forced logits of the same `forced` continuations."""
    ref, got = torch.cat(reference), torch.cat(other)
    targets = torch.tensor([t for c in forced for t in c])
    top2 = ref.topk(2, dim=-1).values
    nll = [torch.nn.functional.cross_entropy(x, targets).item() for x in (ref, got)]
    return Agreement(margins=top2[:, 0] - top2[:, 1], agree=ref.argmax(-1) == got.argmax(-1),
                     max_logit=ref.abs().max().item(), max_logit_diff=(ref - got).abs().max().item(),
                     ppl_ratio=math.exp(nll[1] - nll[0]))


def assert_within_format(a: Agreement, fmt: Format, cfg: ModelShape, paths: str,
                         perplexity: bool = True) -> None:
    """The three measures within what `fmt` explains for a model of shape `cfg`; the message
    names the paths that ran. `perplexity` False: the logits alone, for a few tens of forced
    tokens, whose mean NLL a single near-tie moves by a percent."""
    num_layers, max_k = cfg.num_layers, max(cfg.hidden_size, cfg.intermediate_size)
    bound = fmt.logit_bound(a.max_logit, num_layers, max_k)
    tie = fmt.near_tie(a.max_logit, num_layers, max_k)
    max_ppl = fmt.max_ppl_ratio(a.max_logit, num_layers, max_k)
    what = f"{fmt.name}: {a}; paths: {paths}"
    assert a.max_logit_diff <= bound, f"logits moved more than {bound:.3g}, {what}"
    ties = int((a.margins < tie).sum())
    if fmt.flip_rate is None:
        far = a.margins[~a.agree & (a.margins >= tie)]
        assert not len(far), f"a flip where the margin was {far.max().item():.3g} >= {tie:.3g}, {what}"
    else:
        most = fmt.max_flips(len(a.agree))
        assert a.num_flips <= most, (
            f"more than {most} flips ({FLIP_MARGIN} x the {float(fmt.flip_rate):.1%} measured; "
            f"{ties} near-ties, margin < {tie:.3g}), {what}")
    if perplexity:
        assert 1 / max_ppl <= a.ppl_ratio <= max_ppl, f"perplexity ratio beyond {max_ppl:.4f}, {what}"
