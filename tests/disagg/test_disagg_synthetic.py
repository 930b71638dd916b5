"""Prefill + decode workers and the router, as real processes, on a synthetic model (exactness
against a colocated worker is the point; the tiny model keeps it fast)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from frota.engine import numeric_paths as paths
from tests.disagg.fleet import Proc, free_port, internal, keyring, metric, router, wait_for, worker

MODEL = "synthetic:dense-tiny"
PROMPTS = ["Hi", "The quick brown fox jumps over the lazy dog. " * 6,
           "".join(chr(ord("a") + i % 26) for i in range(161))]


@contextlib.contextmanager
def disaggregated(procs: dict[str, Proc], logs: Path, timeout_s: float = 240) -> Iterator[dict[str, Proc]]:
    """The started workers once ready, with a router over their "prefill" and "decode" ones
    (as "router"); every process stopped after."""
    try:
        for p in procs.values():
            p.wait_ready(timeout_s)
        procs["router"] = router("router", logs, decode=[procs["decode"].url],
                                 prefill=[procs["prefill"].url]).wait_ready()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    logs = tmp_path_factory.mktemp("disagg")
    with disaggregated({
        "colocated": worker("colocated", MODEL, "both", logs),
        "prefill": worker("prefill", MODEL, "prefill", logs, "--kv-handle-ttl", "1"),
        "decode": worker("decode", MODEL, "decode", logs),
    }, logs) as procs:
        yield procs


def complete(url: str, prompt: str, *, stream: bool = False, max_tokens: int = 24) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if not stream:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event, event
                text += event["choices"][0]["text"]
    return text


def test_disaggregated_greedy_output_equals_the_colocated_worker(fleet: dict[str, Proc]) -> None:
    colocated, rtr, decode = fleet["colocated"].url, fleet["router"].url, fleet["decode"].url
    before = metric(rtr, "frota_router_disagg_requests_total", route="disaggregated")
    for prompt in PROMPTS:
        expected = complete(colocated, prompt)
        # the same path on both sides (the workers inherit this process's switches)
        assert complete(rtr, prompt) == expected, f"paths: {paths.describe()}"
        assert complete(rtr, prompt, stream=True) == expected
        assert complete(rtr, prompt, max_tokens=1) == complete(colocated, prompt, max_tokens=1)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[1]}],
            "max_tokens": 16, "temperature": 0}
    answers = [httpx.post(f"{u}/v1/chat/completions", json=chat, timeout=120).json()
               for u in (colocated, rtr)]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
    assert answers[0]["usage"] == answers[1]["usage"]
    num = metric(rtr, "frota_router_disagg_requests_total", route="disaggregated") - before
    assert num == 3 * len(PROMPTS) + 1
    assert metric(decode, "frota_kv_transfer_bytes_total", direction="received") > 0
    assert metric(fleet["prefill"].url, "frota_kv_handles_total", outcome="fetched") >= num
    wait_for(lambda: metric(decode, "vllm:kv_cache_usage_perc") == 0, 10, "decode blocks freed")


def test_unfetched_handles_expire_and_their_blocks_are_freed(fleet: dict[str, Proc]) -> None:
    prefill = fleet["prefill"].url
    expired = metric(prefill, "frota_kv_handles_total", outcome="expired")
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{prefill}/internal/kv/prefill/v1/completions", json=body, timeout=60,
                   headers=internal(fleet["prefill"]))
    assert r.status_code == 200, r.text
    handle = r.json()["kv_handle"]
    assert metric(prefill, "vllm:kv_cache_usage_perc") > 0  # pinned
    wait_for(lambda: metric(prefill, "frota_kv_handles_total", outcome="expired") > expired, 15,
             "the handle to expire (TTL 1s)")
    wait_for(lambda: metric(prefill, "vllm:kv_cache_usage_perc") == 0, 10, "blocks freed")
    assert metric(prefill, "frota_kv_handles_pinned") == 0
    r = httpx.get(f"{prefill}/internal/kv/blocks/{handle['id']}", timeout=10,
                  headers=internal(fleet["prefill"]))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "kv_handle_not_found"


def _handle(fleet: dict[str, Proc], prompt: str) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{fleet['prefill'].url}/internal/kv/prefill/v1/completions", json=body,
                   timeout=60, headers=internal(fleet["prefill"]))
    assert r.status_code == 200, r.text
    return r.json()["kv_handle"]


def test_decode_worker_whose_prefill_peer_died_answers_a_clean_424(fleet: dict[str, Proc]) -> None:
    handle = _handle(fleet, PROMPTS[1])
    # Signed by the fleet (as the router signs the URL it fills in); nobody listens there.
    handle = keyring(fleet["decode"]).sign({**handle, "url": f"http://127.0.0.1:{free_port()}"})
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{fleet['decode'].url}/v1/completions", json=body, timeout=60,
                   headers={"x-frota-kv-handle": json.dumps(handle)})
    assert r.status_code == 424
    assert r.json()["error"]["code"] == "kv_transfer_failed"


def test_decode_worker_rejects_a_foreign_layout_with_409(fleet: dict[str, Proc]) -> None:
    handle = _handle(fleet, PROMPTS[1])
    handle = keyring(fleet["decode"]).sign({**handle, "fingerprint": "0" * 16})
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{fleet['decode'].url}/v1/completions", json=body, timeout=60,
                   headers={"x-frota-kv-handle": json.dumps(handle)})
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "kv_layout_mismatch"
    # The layout is for the worker's log (with the request id), not for whoever asked.
    assert "block_size" not in r.text and "0" * 16 not in r.text
    wait_for(lambda: "block_size" in fleet["decode"].log_path.read_text(), 5, "the logged layout")


class DyingPrefill:
    """Stands in for a prefill worker that hands out a handle and then dies: it forwards the
    prefill to the real one but points the handle at an address where nobody listens."""

    def __init__(self, real: Proc) -> None:
        self.real = real.url
        self.keyring = keyring(real)
        self.dead = f"http://127.0.0.1:{free_port()}"

    def app(self) -> web.Application:
        import aiohttp

        async def ready(request: web.Request) -> web.Response:
            return web.json_response({"status": "ready"})

        async def prefill(request: web.Request) -> web.Response:
            headers = {"Content-Type": "application/json",
                       "Authorization": request.headers.get("Authorization", "")}
            async with aiohttp.ClientSession() as s, s.post(
                    self.real + request.path, data=await request.read(), headers=headers) as r:
                answer = await r.json()
            # A fleet member's handle (signed), pointing where its blocks no longer are.
            answer["kv_handle"] = self.keyring.sign({**answer["kv_handle"], "url": self.dead})
            return web.json_response(answer)

        app = web.Application()
        app.router.add_get("/ready", ready)
        app.router.add_post("/internal/kv/prefill/v1/{tail:.*}", prefill)
        return app


def test_router_runs_colocated_when_the_decode_worker_cannot_pull(
        fleet: dict[str, Proc], tmp_path: Path) -> None:
    from tests.server.harness import app_in_thread

    with app_in_thread(DyingPrefill(fleet["prefill"]).app()) as dying:
        rtr = router("router-dying", fleet["decode"].log_path.parent, decode=[fleet["decode"].url],
                     prefill=[dying]).wait_ready()
        try:
            expected = complete(fleet["colocated"].url, PROMPTS[1])
            assert complete(rtr.url, PROMPTS[1]) == expected
            assert complete(rtr.url, PROMPTS[1], stream=True) == expected
            assert metric(rtr.url, "frota_router_disagg_fallbacks_total",
                          reason="decode_failed") == 2
            assert metric(rtr.url, "frota_router_disagg_requests_total",
                          route="colocated_fallback") == 2
        finally:
            rtr.stop()


def test_short_prompts_stay_colocated(fleet: dict[str, Proc], tmp_path: Path) -> None:
    rtr = router("router-threshold", fleet["decode"].log_path.parent, decode=[fleet["decode"].url],
                 prefill=[fleet["prefill"].url], min_prompt_tokens=20).wait_ready()
    try:
        assert complete(rtr.url, "Hi") == complete(fleet["colocated"].url, "Hi")
        assert complete(rtr.url, PROMPTS[1]) == complete(fleet["colocated"].url, PROMPTS[1])
        assert metric(rtr.url, "frota_router_disagg_requests_total", route="colocated_short") == 1
        assert metric(rtr.url, "frota_router_disagg_requests_total", route="disaggregated") == 1
    finally:
        rtr.stop()
