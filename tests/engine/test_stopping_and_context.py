"""The two request rules decided in one place each: when a sequence stops (`StopRule`) and
whether a request fits the context window (`fit_to_context`), for the engine and the server."""

from __future__ import annotations

import pytest

from frota.engine.context import fit_to_context
from frota.engine.errors import ContextLengthError, InvalidRequestError
from frota.engine.sampling_params import SamplingParams
from frota.engine.sequence import Sequence
from frota.engine.stopping import StopRule

EOS = 2


class _Matcher:
    def __init__(self, is_terminated: bool) -> None:
        self.is_terminated = is_terminated

    def accept(self, token: int) -> None:
        pass


def _after(tokens: list[int], *, matcher_done: bool | None = None, **params: object) -> Sequence:
    seq = Sequence("r", [10, 11, 12], SamplingParams(**params))  # type: ignore[arg-type]
    if matcher_done is not None:
        seq.matcher = _Matcher(matcher_done)
    for token in tokens:
        seq.append_token(token)
    return seq


RULE = StopRule((EOS,), max_model_len=8)


@pytest.mark.parametrize(("seq", "stop_string_hit", "reason"), [
    (_after([5]), False, None),
    (_after([5]), True, "stop"),  # the detokenizer found a stop string
    (_after([EOS]), False, "stop"),
    (_after([EOS], ignore_eos=True), False, None),
    (_after([7], stop_token_ids=[7]), False, "stop"),
    (_after([5, 5], max_tokens=2), False, "length"),
    (_after([5] * 5, max_tokens=16), False, "length"),  # 3 + 5 tokens fill the window of 8
    (_after([5], matcher_done=True), False, "stop"),  # the grammar has ended
    (_after([5], matcher_done=False), False, None),
    (_after([5, 5], max_tokens=2, matcher_done=True), False, "length"),  # length is checked first
], ids=["none", "stop string", "eos", "ignore eos", "stop token", "max tokens", "window",
        "grammar end", "grammar open", "length before grammar"])
def test_the_stop_rule_names_the_reason_a_token_ends_a_sequence(seq, stop_string_hit, reason):
    assert RULE.finish_reason(seq, stop_string_hit=stop_string_hit) == reason


def test_a_request_fits_the_window_as_the_openai_routes_ask():
    assert fit_to_context(3, 8) == 5  # no max_tokens: what the window leaves
    assert fit_to_context(3, 8, 5) == 5
    with pytest.raises(ContextLengthError, match="you requested 9 tokens") as err:
        fit_to_context(3, 8, 6)
    assert (err.value.param, err.value.code) == ("max_tokens", "context_length_exceeded")
    with pytest.raises(ContextLengthError, match="the prompt has 8 tokens") as err:
        fit_to_context(8, 8, prompt_param="messages")  # no room left for a token
    assert err.value.param == "messages"
    with pytest.raises(InvalidRequestError, match="empty") as err:
        fit_to_context(0, 8)
    assert err.value.code is None


def test_the_engine_takes_a_prompt_that_fills_the_window():
    assert fit_to_context(8, 8, room=0) == 0
    with pytest.raises(ContextLengthError):
        fit_to_context(9, 8, room=0)
