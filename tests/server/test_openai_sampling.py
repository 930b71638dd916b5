"""Penalties, logit_bias, min_tokens, max_completion_tokens and echo through the official `openai`
client against a real `frota worker` serving SmolLM2."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
REPEATS = "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the"


def greedy(oai: openai.OpenAI, prompt: str | list[int], max_tokens: int = 16, **extra):  # type: ignore[no-untyped-def]
    return oai.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens,
                                  temperature=0, **extra)


def test_a_strong_negative_logit_bias_on_the_greedy_token_changes_the_output(
        oai: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode(PROMPT)
    plain = greedy(oai, ids, 1, logprobs=1).choices[0]
    first = tokenizer.encode(PROMPT + plain.text)[len(ids)]
    assert tokenizer.decode([first]) == plain.text
    biased = greedy(oai, ids, 1, logprobs=1, logit_bias={str(first): -100}).choices[0]
    assert biased.text != plain.text
    # Reported logprobs are the model's own: the banned token still tops them.
    assert list(biased.logprobs.top_logprobs[0]) == [plain.text]


def test_frequency_penalty_reduces_repetition(oai: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    def distinct(**extra: object) -> float:
        body = {"ignore_eos": True, **extra.pop("extra_body", {})}  # type: ignore[dict-item]
        text = greedy(oai, REPEATS, 24, extra_body=body, **extra).choices[0].text
        ids = tokenizer.encode(text)
        return len(set(ids)) / len(ids)

    plain = distinct()
    assert distinct(frequency_penalty=1.5) > plain
    assert distinct(presence_penalty=2.0) > plain
    assert distinct(extra_body={"repetition_penalty": 1.8}) > plain


def test_min_tokens_holds_off_eos(oai: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Reply with just the word OK."}]
    short = oai.chat.completions.create(model="smollm2", messages=messages, max_tokens=40,
                                        temperature=0)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens + 6
    held = oai.chat.completions.create(model="smollm2", messages=messages, max_tokens=40,
                                       temperature=0, extra_body={"min_tokens": n})
    assert held.usage.completion_tokens >= n


def test_max_completion_tokens_wins_over_max_tokens(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Count to twenty."}],
        max_tokens=20, max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_echo_logprobs_score_the_prompt_as_generation_would(oai: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode(PROMPT + " Paris")
    scored = greedy(oai, PROMPT + " Paris", 0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == PROMPT + " Paris"
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == PROMPT + " Paris"
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[-1] == len(PROMPT)
    assert scored.usage.completion_tokens == 0
    # The last prompt token's score equals its logprob as the next token of the prefix.
    step = greedy(oai, ids[:-1], 1, logprobs=5).choices[0].logprobs.top_logprobs[0]
    assert step[lp.tokens[-1]] == pytest.approx(lp.token_logprobs[-1], abs=1e-3)


def test_echo_then_generation_and_streamed_echo(oai: openai.OpenAI) -> None:
    full = greedy(oai, PROMPT, 4, echo=True, logprobs=0)
    plain = greedy(oai, PROMPT, 4)
    assert full.choices[0].text == PROMPT + plain.choices[0].text
    assert len(full.choices[0].logprobs.tokens) == full.usage.prompt_tokens + 4
    chunks = list(greedy(oai, PROMPT, 4, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
