"""Property-based fuzzing of request bodies: no 5xx, no crash, every error OpenAI-shaped.

Runs against the app with a fake engine (many examples, fast) and against a
real `frota worker` serving a tiny synthetic model (fewer examples).
Set FROTA_FUZZ_REPORT=path to write the counts (requests tried, statuses seen).
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frota.server.app import ServerOptions, create_app
from tests.server.conftest import MODEL, bindings
from tests.server.fake_engine import FakeEngine
from tests.server.harness import app_in_thread

ALLOWED = {200, 400, 404, 413, 429}

junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=6,
)


def field(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value, one time in sixteen anything JSON can hold."""
    return st.integers(0, 15).flatmap(lambda k: junk if k == 0 else good)


def sampling(model: str) -> dict[str, st.SearchStrategy]:
    return {
        "n": field(st.integers(1, 3)),
        "stream": field(st.booleans()),
        "stream_options": field(st.fixed_dictionaries({"include_usage": st.booleans()})),
        "stop": field(st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3)),
        "seed": field(st.integers(-(2**31), 2**31) | st.integers(-(2**64), 2**64)),
        "temperature": field(st.floats(0, 2) | st.floats(-1, 300)),
        "top_p": field(st.floats(0.01, 1) | st.floats(-0.5, 1.5)),
        "top_k": field(st.integers(-3, 50)),
        "max_tokens": field(st.integers(1, 4) | st.integers(-2, 8)),
        "ignore_eos": field(st.booleans()),
        "frequency_penalty": field(st.sampled_from([0.0, 0.0, 0.5])),
    }


message = st.fixed_dictionaries(
    {"role": field(st.sampled_from(["system", "user", "assistant", "developer", "tool", "x"])),
     "content": field(st.text(max_size=30) | st.lists(
         st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}),
         max_size=2))})


def bodies(model: str, bounded: bool) -> st.SearchStrategy[tuple[str, object]]:
    """Request bodies; `bounded` always sets max_tokens (a real model on a CPU is slow)."""
    required = {"max_tokens": field(st.integers(1, 4))} if bounded else {}
    optional = {k: v for k, v in sampling(model).items() if k not in required}
    completion = st.fixed_dictionaries({
        **required,
        "model": field(st.sampled_from([model, model, model, "other-model"])),
        "prompt": field(st.text(max_size=40) | st.lists(st.integers(-5, 300), max_size=8)
                        | st.lists(st.text(max_size=10), max_size=3)),
    }, optional={
        **optional,
        "logprobs": field(st.integers(-1, 21)),
        "echo": field(st.booleans())})
    chat = st.fixed_dictionaries({
        **required,
        "model": field(st.sampled_from([model, model, model, "other-model"])),
        "messages": field(st.lists(message, max_size=4)),
    }, optional={
        **optional,
        "max_completion_tokens": field(st.integers(1, 4) | st.integers(-2, 8)),
        "logprobs": field(st.booleans()),
        "top_logprobs": field(st.integers(-1, 21))})
    return st.one_of(
        st.tuples(st.just("/v1/completions"), completion),
        st.tuples(st.just("/v1/chat/completions"), chat),
        st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), junk),
    )


class Tally:
    """Statuses seen, per target."""

    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter[int]] = collections.defaultdict(
            collections.Counter)

    def report(self) -> None:
        data = {t: {"requests": sum(c.values()), "statuses": dict(sorted(c.items()))}
                for t, c in self.counts.items()}
        print("\nfuzz counts:", json.dumps(data))
        path = os.environ.get("FROTA_FUZZ_REPORT")
        if path:
            old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
            Path(path).write_text(json.dumps({**old, **data}, indent=2))


TALLY = Tally()


def check(client: httpx.Client, target: str, path: str, body: object) -> None:
    # json.dumps writes NaN/Infinity, which Python servers parse: part of the fuzz.
    with client.stream("POST", path, content=json.dumps(body),
                       headers={"Content-Type": "application/json"}) as resp:
        raw = resp.read()
    TALLY.counts[target][resp.status_code] += 1
    assert resp.status_code in ALLOWED, (resp.status_code, body, raw[:500])
    if resp.status_code != 200:
        error = json.loads(raw)["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        return
    if resp.headers["content-type"].startswith("text/event-stream"):
        assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
        assert b'"error"' not in raw, raw[-500:]
    else:
        assert "choices" in json.loads(raw)


def run_fuzz(url: str, target: str, model: str, max_examples: int, bounded: bool) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:

        @settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(bodies(model, bounded))
        def fuzz(case: tuple[str, object]) -> None:
            check(client, target, *case)

        fuzz()
        # Still alive and well after the storm.
        assert client.get("/health").status_code == 200
        assert client.get("/ready").status_code == 200
    TALLY.report()


def test_fuzzed_bodies_never_5xx_fake_engine() -> None:
    app = create_app(ServerOptions(MODEL, warmup=False), bindings(FakeEngine(max_model_len=64)))
    with app_in_thread(app) as url:
        from tests.server.harness import wait_ready
        wait_ready(url, timeout_s=10)
        run_fuzz(url, "fake-engine", MODEL, max_examples=int(os.environ.get(
            "FROTA_FUZZ_EXAMPLES", "600")), bounded=False)


@pytest.mark.slow
def test_fuzzed_bodies_never_5xx_real_worker(synthetic_worker) -> None:  # type: ignore[no-untyped-def]
    run_fuzz(synthetic_worker.url, "synthetic-worker", synthetic_worker.model,
             max_examples=int(os.environ.get("FROTA_FUZZ_EXAMPLES_REAL", "300")), bounded=True)
    assert synthetic_worker.proc.poll() is None
