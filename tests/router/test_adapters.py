"""LoRA adapters through the router: residency from the workers' metrics and model lists,
routing to resident workers, on-demand single-flight loads, fan-out, replay, auth."""

from __future__ import annotations

import asyncio
from pathlib import Path

from frota.api.fleet_key import Keyring, generate_key
from frota.router.adapters import AdapterConfig, parse_adapter_paths
from frota.router.app import RouterConfig
from frota.router.disagg import DisaggConfig, PrefillPool
from frota.router.discovery import StaticDiscovery
from frota.router.health import LoraInfo, Worker, parse_lora_info, parse_vllm_load
from frota.router.policies import PolicyName, PrefixAwarePolicy, RouteRequest
from frota.router.policies.prefix_aware import adapter_seed, prefix_block_hashes
from tests.router.conftest import wait_until

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0-cpu.metrics"
# vLLM's exposition of the gauge (v1 engine, two label sets reported over time).
LORA_LINES = """# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7645e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="doc"} 1.7646e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7644e+09
"""


def runtime(**paths: str) -> RouterConfig:
    return RouterConfig(probe_interval=0.05,
                        adapters=AdapterConfig(runtime_loading=True, paths=paths))


async def complete(router, model: str, prompt: str = "hello", **headers: str):
    async with router.session.post(router.url + "/v1/completions", headers=headers,
                                   json={"model": model, "prompt": prompt}) as r:
        return r.status, r.headers.get("x-frota-worker"), await r.json()


async def post(router, path: str, body: dict, **headers: str):
    async with router.session.post(router.url + path, json=body, headers=headers) as r:
        text = await r.text()
        return r.status, text, (await r.json() if r.content_type == "application/json" else None)


# -- parsing ---------------------------------------------------------------------

def test_the_newest_lora_sample_names_the_active_adapters():
    text = FIXTURE.read_text() + LORA_LINES
    load = parse_vllm_load(text)
    assert load.lora == LoraInfo(frozenset({"sql", "chat", "doc"}), 2)
    assert (load.num_running, load.num_waiting) == (1.0, 0.0)  # the rest still parses


def test_a_worker_without_lora_has_no_lora_info_and_a_family_without_samples_is_lora_on():
    assert parse_vllm_load(FIXTURE.read_text()).lora is None
    assert parse_lora_info("# HELP vllm:lora_requests_info x\n"
                           "# TYPE vllm:lora_requests_info gauge\n") == LoraInfo()


def test_adapters_flag_parses_and_refuses_what_is_not_name_equals_path():
    assert parse_adapter_paths("sql=/a/sql, chat=/a/chat") == {"sql": "/a/sql",
                                                               "chat": "/a/chat"}
    assert parse_adapter_paths(None) == {}
    try:
        parse_adapter_paths("sql")
    except ValueError as exc:
        assert "NAME=PATH" in str(exc)
    else:
        raise AssertionError("accepted an entry without a path")


# -- the prefix-aware policy keys affinity by adapter ---------------------------------

def test_prefix_affinity_is_kept_per_adapter():
    prompt = "You are a SQL assistant. " * 40
    assert prefix_block_hashes(prompt, 128, 8) != prefix_block_hashes(
        prompt, 128, 8, adapter_seed("sql"))
    assert adapter_seed("sql") != adapter_seed("chat") and adapter_seed(None) == b""

    def request(adapter: str | None) -> RouteRequest:
        body = f'{{"prompt": "{prompt}"}}'.encode()
        return RouteRequest("/v1/completions", body, adapter=adapter)

    workers = [Worker(f"http://w{i}") for i in range(4)]
    policy = PrefixAwarePolicy()
    first = policy.choose(request("sql"), workers)
    again = policy.choose(request("sql"), workers)
    assert again.reason == "prefix_hit" and again.worker is first.worker
    # The same prompt under another adapter (or none) is another prefix, placed by its
    # own key: over many adapters, it lands on every worker.
    homes = {policy.choose(request(f"adapter-{i}"), workers).worker.url for i in range(40)}
    assert len(homes) == 4


# -- routing ------------------------------------------------------------------------

async def test_requests_for_an_adapter_go_to_the_workers_that_hold_it(start_worker, start_router):
    a = await start_worker(name="a", lora=True)
    b = await start_worker(name="b", lora=True, adapters={"sql": "/adapters/sql"})
    # Only in c's metric (requests in flight): resident too, until its list says more.
    c = await start_worker(name="c", lora=True, active=["chat"])
    router = await start_router([a, b, c])
    await wait_until(lambda: router.state.adapters.names >= {"sql", "chat"})
    served = [await complete(router, "sql") for _ in range(6)]
    assert {(s, w) for s, w, _ in served} == {(200, b.url)}
    assert {(await complete(router, "chat"))[1] for _ in range(3)} == {c.url}
    # The base model still spreads over all three (round-robin).
    assert {(await complete(router, "fake"))[1] for _ in range(3)} == {a.url, b.url, c.url}
    assert "stale" not in router.state.pool.workers[a.url].adapters  # an older sample


async def test_without_runtime_loading_an_adapter_nobody_holds_gets_the_workers_404(
        start_worker, start_router):
    a = await start_worker(lora=True)
    router = await start_router([a], RouterConfig(
        probe_interval=0.05, adapters=AdapterConfig(paths={"sql": "/adapters/sql"})))
    status, _, body = await complete(router, "sql")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert a.loads == []
    status, _, _ = await post(router, "/v1/load_lora_adapter",
                              {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert status == 404  # the endpoint exists only with runtime loading, as on vLLM


async def test_concurrent_requests_for_an_unloaded_adapter_wait_on_one_load(
        start_worker, start_router):
    gate = asyncio.Event()  # holds streams (only): the plain requests below never wait
    workers = [await start_worker(name=n, lora=True, gate=gate, load_delay=0.2)
               for n in ("a", "b")]
    router = await start_router(workers, runtime(sql="/adapters/sql"))
    # One stream in flight makes the other worker the least loaded one.
    stream = asyncio.create_task(router.session.post(
        router.url + "/v1/completions", json={"model": "fake", "prompt": "x", "stream": True}))
    pool = router.state.pool
    await wait_until(lambda: any(w.num_outstanding for w in pool.healthy()))
    busy, idle = sorted(workers, key=lambda w: -pool.workers[w.url].num_outstanding)
    served = await asyncio.gather(*(complete(router, "sql") for _ in range(12)))
    assert [s for s, _, _ in served] == [200] * 12
    assert {w for _, w, _ in served} == {idle.url}
    assert (busy.loads, idle.loads) == ([], ["sql"])  # one load for twelve requests
    assert idle.adapters == {"sql": "/adapters/sql"}
    assert router.metric("frota_router_adapter_loads_total", trigger="demand",
                         result="ok") == 1
    gate.set()
    (await stream).close()


async def test_the_path_a_worker_lists_serves_a_load_on_demand_when_it_is_gone(
        start_worker, start_router):
    a = await start_worker(name="a", lora=True)
    b = await start_worker(name="b", lora=True, adapters={"sql": "/adapters/sql"})
    router = await start_router([a, b], runtime())
    await wait_until(lambda: router.state.adapters.paths == {"sql": "/adapters/sql"})
    b.is_ready = False  # the only worker holding it leaves
    await wait_until(lambda: len(router.state.pool.healthy()) == 1)
    status, worker, _ = await complete(router, "sql")
    assert (status, worker) == (200, a.url) and a.adapters == {"sql": "/adapters/sql"}


async def test_a_load_made_on_a_worker_directly_is_seen_at_the_next_refresh(
        start_worker, start_router):
    a, b = await start_worker(name="a", lora=True), await start_worker(name="b", lora=True)
    config = RouterConfig(probe_interval=0.02, adapters=AdapterConfig(refresh_interval=0.1))
    router = await start_router([a, b], config)
    b.adapters["sql"] = "/adapters/sql"  # nothing in flight: only /v1/models shows it
    await wait_until(lambda: "sql" in router.state.pool.workers[b.url].adapters)
    assert {(await complete(router, "sql"))[1] for _ in range(3)} == {b.url}


async def test_a_failed_on_demand_load_passes_the_request_on(start_worker, start_router):
    a = await start_worker(lora=True, load_status=400)
    router = await start_router([a], runtime(sql="/adapters/sql"))
    status, _, body = await complete(router, "sql")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert router.metric("frota_router_adapter_loads_total", trigger="demand",
                         result="error") == 1


# -- loads through the router ----------------------------------------------------------

async def test_a_load_fans_out_to_every_worker_and_an_unload_too(start_worker, start_router):
    a, b = await start_worker(name="a", lora=True), await start_worker(name="b", lora=True)
    router = await start_router([a, b], runtime())
    status, text, _ = await post(router, "/v1/load_lora_adapter",
                                 {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert status == 200 and "sql" in text
    assert a.adapters == b.adapters == {"sql": "/adapters/sql"}
    assert router.state.adapters.recorded == {"sql": "/adapters/sql"}
    assert {(await complete(router, "sql"))[1] for _ in range(4)} == {a.url, b.url}
    async with router.session.get(router.url + "/v1/models") as r:
        assert "sql" in [m["id"] for m in (await r.json())["data"]]
    assert router.metric("frota_router_adapter_loads_total", trigger="api", result="ok") == 2
    # Loading it again: every worker says so, and the router passes that on.
    status, _, body = await post(router, "/v1/load_lora_adapter",
                                 {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert status == 400 and body["error"]["code"] == "adapter_exists"
    assert router.metric("frota_router_adapter_loads_total", trigger="api", result="noop") == 2

    status, _, _ = await post(router, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert status == 200 and a.adapters == b.adapters == {}
    assert router.state.adapters.recorded == {}
    assert all("sql" not in w.adapters for w in router.state.pool.healthy())
    status, _, body = await post(router, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert status == 404 and body["error"]["code"] == "adapter_not_found"


async def test_a_load_one_worker_refuses_answers_its_error_without_naming_it(start_worker,
                                                                             start_router):
    a = await start_worker(name="a", lora=True)
    b = await start_worker(name="b", lora=True, load_status=400)
    router = await start_router([a, b], runtime())
    status, _, body = await post(router, "/v1/load_lora_adapter",
                                 {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert status == 400
    error = body["error"]
    assert error["code"] == "invalid_adapter" and "cannot load sql" in error["message"]
    assert "1 of 2 workers" in error["message"] and b.url not in str(body)
    assert a.adapters == {"sql": "/adapters/sql"}  # the worker that took it keeps it
    assert (await complete(router, "sql"))[1] == a.url
    status, _, body = await post(router, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400 and "lora_path" in body["error"]["message"]


async def test_a_load_no_worker_takes_is_not_recorded(start_worker, start_router):
    a = await start_worker(lora=True, load_status=400)
    router = await start_router([a], runtime())
    status, _, _ = await post(router, "/v1/load_lora_adapter",
                              {"lora_name": "sql", "lora_path": "/nowhere"})
    assert status == 400 and router.state.adapters.recorded == {}


async def test_a_worker_that_joins_later_gets_the_loads_before_it_serves(
        start_worker, start_router):
    a = await start_worker(name="a", lora=True)
    router = await start_router([a], runtime())
    assert (await post(router, "/v1/load_lora_adapter",
                       {"lora_name": "sql", "lora_path": "/adapters/sql"}))[0] == 200
    pool = router.state.pool
    in_rotation_at_load: list[bool] = []
    late = await start_worker(name="late", lora=True, on_load=lambda _: in_rotation_at_load.append(
        pool.workers[late.url].is_healthy))
    pool.set_urls([a.url, late.url])
    await wait_until(lambda: len(pool.healthy()) == 2)
    assert late.adapters == {"sql": "/adapters/sql"} and in_rotation_at_load == [False]
    assert router.metric("frota_router_adapter_loads_total", trigger="replay", result="ok") == 1
    # After an unload, a worker that joins gets nothing.
    assert (await post(router, "/v1/unload_lora_adapter", {"lora_name": "sql"}))[0] == 200
    later = await start_worker(name="later", lora=True)
    pool.set_urls([a.url, late.url, later.url])
    await wait_until(lambda: len(pool.healthy()) == 3)
    assert later.loads == []


async def test_a_worker_that_restarts_gets_the_loads_again(start_worker, start_router):
    a = await start_worker(lora=True)
    router = await start_router([a], runtime())
    assert (await post(router, "/v1/load_lora_adapter",
                       {"lora_name": "sql", "lora_path": "/adapters/sql"}))[0] == 200
    pool = router.state.pool
    a.is_ready = False  # restarting: out of rotation at the first 503
    await wait_until(lambda: not pool.healthy())
    a.adapters.clear()  # what a new process holds: only its start-up adapters
    a.is_ready = True
    await wait_until(lambda: bool(pool.healthy()))
    assert a.loads == ["sql", "sql"] and a.adapters == {"sql": "/adapters/sql"}
    assert pool.healthy()[0].adapters == {"sql"}


async def test_a_lora_worker_whose_metrics_fail_at_first_is_tracked_once_they_answer(
        start_worker, start_router):
    a = await start_worker(lora=True, adapters={"sql": "/adapters/sql"}, metrics_stall=True)
    router = await start_router([a], RouterConfig(probe_interval=0.05, probe_timeout=0.2))
    worker = router.state.pool.healthy()[0]  # admitted: its /metrics is not its health
    assert worker.lora is None and not worker.metrics_read
    a.metrics_stall = False
    await wait_until(lambda: worker.adapters == {"sql"})
    assert (await complete(router, "sql"))[0] == 200


async def test_adapter_endpoints_are_behind_the_api_key(start_worker, start_router):
    a = await start_worker(lora=True)
    router = await start_router([a], RouterConfig(
        probe_interval=0.05, api_keys=frozenset({"sk-1"}),
        adapters=AdapterConfig(runtime_loading=True)))
    body = {"lora_name": "sql", "lora_path": "/adapters/sql"}
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        status, _, error = await post(router, path, body)
        assert status == 401 and error["error"]["code"] == "invalid_api_key"
    assert a.loads == [] and a.unloads == []
    assert (await post(router, "/v1/load_lora_adapter", body,
                       Authorization="Bearer sk-1"))[0] == 200
    assert a.adapters == {"sql": "/adapters/sql"}


async def test_in_pd_mode_loads_reach_prefill_workers_too(start_worker, start_router):
    decode = await start_worker(name="decode", lora=True)
    prefill = await start_worker(name="prefill", lora=True)
    config = runtime()
    config.keyring = Keyring(generate_key().encode())
    config.adapters.runtime_loading = True
    config.disagg = PrefillPool(DisaggConfig(), StaticDiscovery([prefill.url]), config.keyring)
    router = await start_router([decode], config)
    await wait_until(lambda: bool(config.disagg.pool.healthy()))
    status, _, _ = await post(router, "/v1/load_lora_adapter",
                              {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert status == 200
    assert decode.adapters == prefill.adapters == {"sql": "/adapters/sql"}
    assert config.disagg.pick_prefill("sql").url == prefill.url
    # Loads on workers are internal calls: each carried the fleet's credential.
    expected = config.keyring.authorization()[1]
    assert [h["Authorization"] for h in decode.load_headers + prefill.load_headers] == [expected] * 2


async def test_models_through_the_router_lists_adapters_any_worker_holds(
        start_worker, start_router):
    a = await start_worker(name="a", lora=True)
    b = await start_worker(name="b", lora=True, adapters={"sql": "/adapters/sql"})
    router = await start_router([a, b], RouterConfig(probe_interval=0.05,
                                                     policy=PolicyName.ROUND_ROBIN))
    await wait_until(lambda: "sql" in router.state.adapters.names)
    for _ in range(2):  # whichever worker answers
        async with router.session.get(router.url + "/v1/models") as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        assert ids == ["fake", "sql"]


# -- the flags --------------------------------------------------------------------------

def test_lora_flags_and_their_environment(monkeypatch):
    import argparse

    from frota.router.cli import add_arguments, config_from_args

    def config(*argv: str) -> AdapterConfig:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return config_from_args(parser.parse_args(["--workers", "w:1", *argv])).adapters

    assert config() == AdapterConfig()
    assert config("--lora-runtime-loading", "--adapters", "sql=/a/sql") == AdapterConfig(
        runtime_loading=True, paths={"sql": "/a/sql"})
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")  # vLLM's name
    assert config().runtime_loading
    monkeypatch.setenv("FROTA_LORA_RUNTIME_LOADING", "false")  # the router's own wins
    assert not config().runtime_loading
    monkeypatch.setenv("FROTA_ADAPTER_REFRESH", "2.5")
    assert config().refresh_interval == 2.5
