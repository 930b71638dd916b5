"""The official `openai` client against a real `frota worker` serving SmolLM2."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest

from tests.server.harness import WorkerProcess

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_models_lists_smollm2(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["smollm2"]


def test_greedy_completion_stream_assembles_to_the_full_text(oai: openai.OpenAI) -> None:
    full = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=24, temperature=0)
    assert full.choices[0].text
    assert full.usage.completion_tokens <= 24
    stream = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=24,
                                    temperature=0, stream=True,
                                    stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text


def test_chat_completion_stream_matches_non_stream(oai: openai.OpenAI) -> None:
    full = oai.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=32,
                                       temperature=0)
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content
    stream = oai.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=32,
                                         temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == full.choices[0].message.content


def test_usage_counts_equal_tokenizer_counts(oai: openai.OpenAI, tokenizer) -> None:  # type: ignore[no-untyped-def]
    out = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=12, temperature=0,
                                 logprobs=0, extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert out.usage.completion_tokens == 12 == len(out.choices[0].logprobs.tokens)
    chat = oai.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5,
                                       temperature=0, extra_body={"ignore_eos": True})
    templated = tokenizer.apply_chat_template(MESSAGES)
    assert chat.usage.prompt_tokens == len(tokenizer.encode(templated))
    assert chat.usage.completion_tokens == 5
    assert chat.choices[0].finish_reason == "length"


def test_stop_string_ends_the_text_before_it(oai: openai.OpenAI) -> None:
    full = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=24,
                                  temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    stop = full.strip()[len(full.strip()) // 2:][:3]
    cut = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=24, temperature=0,
                                 stop=[stop, "\u2603"])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert full.startswith(cut.choices[0].text)


def test_seed_reproduces_and_n_gives_distinct_choices(oai: openai.OpenAI) -> None:
    def sample(seed: int, n: int = 1) -> list[str]:
        out = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=16,
                                     temperature=1.0, seed=seed, n=n)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    assert sample(1234) == sample(1234)
    pair = sample(1234, n=2)
    assert len(pair) == 2 and pair[0] == sample(1234)[0]
    assert pair[0] != pair[1]


def test_errors_reach_the_client_typed(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as exc:
        oai.completions.create(model="smollm2", prompt="word " * 5000, max_tokens=1)
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="smollm2", messages=[], max_tokens=1)
    assert exc.value.body["param"] == "messages"


async def test_32_concurrent_streams_finish_and_show_in_metrics(
        smollm2_worker: WorkerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{smollm2_worker.url}/v1", api_key="unused",
                                max_retries=0)
    seen = {"running": 0.0, "waiting": 0.0}

    async def one(i: int) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, finish, tokens = "", None, 0
        async for chunk in stream:
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish, tokens

    async def watch() -> None:
        async with httpx.AsyncClient() as http:
            while True:
                text = (await http.get(f"{smollm2_worker.url}/metrics")).text
                for key in seen:
                    m = re.search(rf"^vllm:num_requests_{key}\{{[^}}]*\}} (\S+)$", text, re.M)
                    seen[key] = max(seen[key], float(m.group(1)) if m else 0.0)
                await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(*(one(i) for i in range(32)))
    finally:
        watcher.cancel()
    assert all(finish == "length" and tokens == 24 and text for text, finish, tokens in results)
    assert seen["running"] >= 2, seen
    assert seen["waiting"] >= 1, seen  # 32 clients, --max-num-seqs 16


def test_disconnect_mid_stream_frees_the_kv_cache(smollm2_worker: WorkerProcess) -> None:
    url = smollm2_worker.url
    idle = metric(url, "vllm:kv_cache_usage_perc")
    body = {"model": "smollm2", "prompt": "Once upon a time " * 40, "max_tokens": 1500,
            "ignore_eos": True, "stream": True, "temperature": 0}
    seen: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        deadline = time.monotonic() + 30
        while metric(url, "vllm:kv_cache_usage_perc") <= idle:
            seen.append(next(lines))
            assert time.monotonic() < deadline and "[DONE]" not in seen[-1], seen[-4:]
        assert metric(url, "vllm:num_requests_running") == 1
    # The client hung up mid-stream: the engine request is aborted and its blocks freed.
    deadline = time.monotonic() + 15
    while metric(url, "vllm:kv_cache_usage_perc") > idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(url, "vllm:kv_cache_usage_perc") <= idle
    assert metric(url, "vllm:num_requests_running") == 0
