"""The KV cache the engines report, read from their /metrics (vllm:cache_config_info)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import aiohttp.web
import pytest

from frota.engine.outputs import EngineStats
from frota.operator.reports.kv_report import kv_cache_tokens, read
from frota.server.metrics import ServerMetrics
from tests.loopback import serving

VLLM_SCRAPE = Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0-cpu.metrics"


def frota_worker_metrics(num_blocks: int, block_size: int = 16) -> str:
    """The exposition text Frota's own worker serves on /metrics."""
    stats = EngineStats(num_running=0, num_waiting=0, num_kv_blocks_total=num_blocks,
                        num_kv_blocks_used=0, block_size=block_size, prefix_cache_queries=0,
                        prefix_cache_hits=0)
    return ServerMetrics("smollm2", lambda: stats).render().decode()


def test_a_vllm_scrape_reports_blocks_times_block_size() -> None:
    # block_size="32", num_gpu_blocks="728" beside vLLM's many other labels
    assert kv_cache_tokens(VLLM_SCRAPE.read_text()) == 32 * 728 == 23296


def test_frota_workers_report_in_the_same_gauge() -> None:
    assert kv_cache_tokens(frota_worker_metrics(2110, 16)) == 33760


def test_a_loading_frota_worker_reports_nothing() -> None:
    loading = ServerMetrics("smollm2", lambda: None).render().decode()
    assert kv_cache_tokens(loading) is None


def test_text_without_the_gauge_reports_nothing() -> None:
    text = ("# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="smollm2"} 3\n')
    assert kv_cache_tokens(text) is None


def test_a_cache_not_sized_yet_reports_nothing() -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert kv_cache_tokens(text) is None


def test_several_engines_in_one_process_report_the_smallest() -> None:
    text = ('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
            'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="90"} 1.0\n')
    assert kv_cache_tokens(text) == 1440


@pytest.mark.parametrize("junk", [
    "", "garbage", "<html><body>502 Bad Gateway</body></html>", "{{{ }}}",
    'vllm:cache_config_info{block_size="16" 1', "\x00\xff\ufffd",
    VLLM_SCRAPE.read_text()[:20000].replace('"', "", 7),
])
def test_junk_reports_nothing_and_never_raises(junk: str) -> None:
    assert kv_cache_tokens(junk) is None


@pytest.fixture
async def workers() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """Workers on one local server: /small and /large report caches, /down fails,
    /plain has no gauge."""
    pages = {"/small": frota_worker_metrics(100), "/large": VLLM_SCRAPE.read_text(),
             "/plain": "# TYPE up gauge\nup 1\n"}

    async def page(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if request.path not in pages:
            return aiohttp.web.Response(status=503, text="loading")
        return aiohttp.web.Response(text=pages[request.path])

    app = aiohttp.web.Application()
    app.router.add_get("/{name}", page)
    async with serving(app) as base, aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield base, session


async def test_read_reports_the_smallest_replica_that_answered(
    workers: tuple[str, aiohttp.ClientSession],
) -> None:
    base, session = workers
    urls = [f"{base}/large", f"{base}/down", f"{base}/small", f"{base}/plain",
            "http://127.0.0.1:1/metrics"]
    assert await read(session, urls) == 1600
    assert await read(session, [f"{base}/large"]) == 23296


async def test_read_reports_nothing_when_no_replica_reports(
    workers: tuple[str, aiohttp.ClientSession],
) -> None:
    base, session = workers
    assert await read(session, [f"{base}/down", f"{base}/plain"]) is None
    assert await read(session, []) is None
