"""Grammar-constrained decoding in the engine (synthetic model, byte tokenizer): masks, finishing
by grammar, neighbours left bit-identical, n > 1, preemption, compile errors at admission."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from frota.engine import Constraint, SamplingParams
from frota.engine.errors import InvalidRequestError
from frota.engine.grammar import Grammars
from frota.engine.llm_engine import LLMEngine
from frota.engine.tokenizer import ByteTokenizer
from tests.engine.synthetic import load_synthetic, make_engine
from tests.json_schemas import OBJECT_SCHEMAS

pytest.importorskip("xgrammar")
REGEX = Constraint("regex", "[a-e]{3,8}(-[0-9]{2})?")
SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"const": "x"}, "minItems": 1, "maxItems": 3}},
    "required": ["kind", "ok", "n", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def loaded():
    return load_synthetic("synthetic:dense-tiny,layers=2,seed=5")


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]):
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params)
    texts = dict.fromkeys(requests, "")
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    reasons: dict[str, str | None] = {}
    while engine.has_unfinished:
        for out in engine.step():
            texts[out.request_id] += out.new_text
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return texts, tokens, reasons


PROMPT = list(range(60, 90))


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0, constraint=REGEX),
    SamplingParams(max_tokens=40, temperature=1.0, seed=7, constraint=REGEX),
    SamplingParams(max_tokens=40, temperature=0.8, top_k=20, top_p=0.9, seed=3, constraint=REGEX),
], ids=["greedy", "sampled", "top-k-top-p"])
def test_constrained_output_matches_and_finishes_by_grammar(loaded, params) -> None:
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    texts, _, reasons = run(engine, {"r": (PROMPT, params)})
    assert re.fullmatch(REGEX.value, texts["r"]), texts["r"]
    assert reasons["r"] == "stop"


def test_json_schema_output_validates(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    c = Constraint.json_schema(SCHEMA)
    texts, _, reasons = run(engine, {
        f"r{i}": (PROMPT[i:], SamplingParams(max_tokens=120, temperature=1.0, seed=i, constraint=c))
        for i in range(4)})
    for rid, text in texts.items():
        jsonschema.validate(json.loads(text), SCHEMA)
        assert reasons[rid] == "stop"


@pytest.mark.parametrize("neighbour", [
    SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=1.0, seed=11, ignore_eos=True),
], ids=["greedy", "seeded"])
def test_free_rows_are_bit_identical_beside_constrained_rows(loaded, neighbour) -> None:
    alone = run(make_engine(loaded, num_kv_blocks=64, block_size=4),
                {"free": (PROMPT, neighbour)})[1]["free"]
    mixed = run(make_engine(loaded, num_kv_blocks=64, block_size=4), {
        "c1": (PROMPT, SamplingParams(max_tokens=30, temperature=0, constraint=REGEX)),
        "free": (PROMPT, neighbour),
        "c2": (PROMPT[3:], SamplingParams(max_tokens=30, temperature=1.0, seed=2,
                                          constraint=Constraint.json_schema(SCHEMA))),
    })[1]["free"]
    assert mixed == alone


def test_each_child_of_a_seeded_request_has_its_own_matcher(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=64, block_size=4)
    texts, _, _ = run(engine, {f"r-{i}": (PROMPT, SamplingParams(
        max_tokens=40, temperature=1.5, seed=100 + i, constraint=REGEX)) for i in range(4)})
    assert all(re.fullmatch(REGEX.value, t) for t in texts.values()), texts
    assert len(set(texts.values())) > 1  # independent draws, each valid on its own


def test_preempted_constrained_sequence_gives_the_same_output(loaded) -> None:
    c = Constraint.json_schema(SCHEMA)
    greedy = SamplingParams(max_tokens=70, temperature=0, constraint=c)
    roomy = run(make_engine(loaded, num_kv_blocks=128, block_size=4), {"c": (PROMPT, greedy)})
    engine = make_engine(loaded, num_kv_blocks=26, block_size=4, max_num_batched_tokens=16)
    tight = run(engine, {
        "c": (PROMPT, greedy),
        "b": (list(range(100, 130)), SamplingParams(max_tokens=40, temperature=0,
                                                     ignore_eos=True)),
    })
    assert engine.scheduler.num_preemptions > 0
    assert tight[1]["c"] == roomy[1]["c"]
    jsonschema.validate(json.loads(tight[0]["c"]), SCHEMA)


def test_a_grammar_that_does_not_compile_is_refused_before_queueing(loaded) -> None:
    engine = make_engine(loaded, num_kv_blocks=16)
    with pytest.raises(InvalidRequestError) as exc:
        engine.add_request("r", PROMPT, SamplingParams(constraint=Constraint("regex", "((")))
    assert exc.value.param == "response_format"
    assert "parenthesis" in exc.value.message
    with pytest.raises(InvalidRequestError) as exc:
        engine.add_request("t", PROMPT, SamplingParams(
            constraint=Constraint.json_schema({"type": "frobnicate"})))
    assert "frobnicate" in exc.value.message
    assert not engine.has_unfinished and not engine.requests


def test_compiled_grammars_are_cached_by_kind_and_text() -> None:
    grammars = Grammars(ByteTokenizer(300))
    a = grammars.compile(Constraint.json_schema({"type": "integer"}))
    assert grammars.compile(Constraint.json_schema({"type": "integer"})) is a
    assert grammars.compile(Constraint("regex", "[0-9]+")) is not a
    grammars.cache_size = 1
    grammars.compile(Constraint("regex", "x"))
    assert len(grammars._cache) == 1


def test_logit_columns_past_the_tokenizer_vocabulary_are_masked() -> None:
    grammars = Grammars(ByteTokenizer(258))
    matcher = grammars.matcher(Constraint("regex", "ab"))
    logits = torch.zeros(3, 300)
    grammars.mask_logits(logits, [1], [matcher])
    assert torch.equal(logits[0], torch.zeros(300)) and torch.equal(logits[2], torch.zeros(300))
    assert (logits[1] > float("-inf")).nonzero().flatten().tolist() == [ord("a")]


ENGINE_EXAMPLES = int(os.environ.get("FROTA_STRUCTURED_ENGINE_EXAMPLES", "100"))


@settings(max_examples=ENGINE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=OBJECT_SCHEMAS)
def test_any_supported_schema_is_met_greedy_and_sampled_beside_a_free_row(loaded, schema) -> None:
    """A hundred generated schemas by default (FROTA_STRUCTURED_ENGINE_EXAMPLES for more;
    the real model's test runs a few): a random model
    is the hardest writer, and whatever it prefers, the output validates and finishes by
    the grammar, while a free row in the same batch runs as if alone."""
    engine = make_engine(loaded, num_kv_blocks=256, block_size=4)
    c = Constraint.json_schema(schema)
    free = SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True)
    texts, tokens, reasons = run(engine, {
        "greedy": (PROMPT, SamplingParams(max_tokens=600, temperature=0, constraint=c)),
        "sampled": (PROMPT, SamplingParams(max_tokens=600, temperature=1.0, seed=3, constraint=c)),
        "free": (PROMPT, free)})
    for rid in ("greedy", "sampled"):
        assert reasons[rid] == "stop", (schema, rid, texts[rid])
        jsonschema.validate(json.loads(texts[rid]), schema)
    _, alone_tokens, _ = run(make_engine(loaded, num_kv_blocks=256, block_size=4),
                                 {"free": (PROMPT, free)})
    assert tokens["free"] == alone_tokens["free"]
