"""Whether a sequence stops after its newest token, and why: decided here and nowhere else.

In order: a stop string the text now contains (found by the request's detokenizer, which
matches text, not tokens), a stop token or EOS ("stop"), its length limit, max_tokens or
the context window ("length"), the end of its grammar ("stop").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from frota.engine.sequence import Sequence


@dataclass(frozen=True)
class StopRule:
    """The engine-wide part of the decision: its EOS tokens and its context window."""

    eos_token_ids: Collection[int]
    max_model_len: int

    def finish_reason(self, seq: Sequence, stop_string_hit: bool = False) -> str | None:
        """The finish reason `seq`'s newest token implies, or None to keep generating."""
        if stop_string_hit:
            return "stop"
        token = seq.token_ids[-1]
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_generated_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        if seq.matcher is not None and seq.matcher.is_terminated:
            return "stop"
        return None
