"""logit_bias, min_tokens and the penalties, on hand-built logits with exact expected values."""

from __future__ import annotations

import pytest
import torch

from frota.engine import logits_processing
from frota.engine.errors import InvalidRequestError
from frota.engine.sampler import Sampler
from frota.engine.sampling_params import SamplingParams
from frota.engine.sequence import Sequence

EOS = 4


def seq(prompt: list[int], generated: list[int] = (), seed: int | None = None,
        **params) -> Sequence:
    p = SamplingParams(**{"max_tokens": 16, "temperature": 0.0, **params})
    p.validate()
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    s = Sequence("r", prompt, p, gen)
    for t in generated:
        s.append_token(t)
    return s


def process(logits: list[float], s: Sequence) -> list[float]:
    out = logits_processing.process(torch.tensor([logits]), [s], (EOS,))
    return out[0].tolist()


def test_frequency_and_presence_penalties_count_generated_tokens_only() -> None:
    s = seq([0, 0, 1], [3, 3, 2], frequency_penalty=0.5, presence_penalty=0.25)
    assert process([1.0, 2.0, 3.0, 4.0, 5.0], s) == [1.0, 2.0, 2.25, 2.75, 5.0]


def test_negative_frequency_penalty_rewards_repeats() -> None:
    s = seq([0], [1, 1], frequency_penalty=-1.0)
    assert process([0.0, 0.0, 0.0], s) == [0.0, 2.0, 0.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_seen_anywhere() -> None:
    s = seq([0], [1], repetition_penalty=2.0)
    assert process([2.0, -2.0, 3.0], s) == [1.0, -4.0, 3.0]


def test_logit_bias_adds_to_the_named_tokens() -> None:
    s = seq([0], logit_bias={1: -100.0, 2: 2.5})
    assert process([1.0, 2.0, 3.0], s) == [1.0, -98.0, 5.5]


def test_min_tokens_masks_eos_and_stop_token_ids_until_reached() -> None:
    s = seq([0], [1], min_tokens=2, stop_token_ids=[2])
    assert process([1.0, 1.0, 1.0, 1.0, 9.0], s) == [1.0, 1.0, float("-inf"), 1.0, float("-inf")]
    s.append_token(1)
    assert not logits_processing.needs_processing(s)


def test_greedy_row_with_a_penalty_picks_from_the_penalized_logits() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0], [0.0, 5.0, 4.0]])
    plain = seq([0], [1])
    penalized = seq([0], [1], frequency_penalty=2.0)
    tokens, _ = Sampler(0)(logits.clone(), [plain, penalized])
    assert tokens == [1, 2]


def test_logprobs_are_the_models_own_before_bias() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0]])
    s = seq([0], logit_bias={1: -100.0}, logprobs=1)
    tokens, logprobs = Sampler(0)(logits.clone(), [s])
    expected = torch.log_softmax(logits[0], -1)
    assert tokens == [2]
    assert logprobs[0].logprob == pytest.approx(float(expected[2]))
    assert logprobs[0].top_logprobs == {1: pytest.approx(float(expected[1]))}


def test_rows_without_processing_are_bit_identical_and_skip_the_processing(monkeypatch) -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)

    def rows() -> list[Sequence]:  # fresh seeded generators for every call
        return [seq([1, 2], [3], seed=7, temperature=0.8, top_p=0.9), seq([5]),
                seq([1], [3], seed=9, temperature=1.0)]

    alone, _ = Sampler(0)(logits.clone(), rows())
    calls = []
    monkeypatch.setattr(logits_processing, "process",
                        lambda *a: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    assert Sampler(0)(logits.clone(), rows())[0] == alone
    assert not calls
    monkeypatch.undo()
    # A penalized row in the batch changes nothing for the others, seeded draws included.
    mixed = [*rows(), seq([1], [7, 7], seed=3, temperature=1.0, presence_penalty=2.0,
                          logit_bias={0: 100.0})]
    tokens, _ = Sampler(0)(torch.cat([logits, torch.randn(1, 50)]), mixed)
    assert tokens[:3] == alone and tokens[3] == 0


def test_penalized_seeded_sampling_is_reproducible() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))

    def draw() -> int:
        s = seq([1, 2, 3], [4, 5], seed=11, temperature=1.0, frequency_penalty=1.5,
                repetition_penalty=1.3)
        return Sampler(0)(logits.clone(), [s])[0][0]

    assert len({draw() for _ in range(5)}) == 1


@pytest.mark.parametrize(("params", "param"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logit_bias": {1: 101.0}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_invalid_processing_params_name_the_field(params: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(**params).validate()
    assert exc.value.param == param


def test_max_tokens_zero_is_valid_for_prompt_scoring() -> None:
    SamplingParams(max_tokens=0, prompt_logprobs=1).validate()
