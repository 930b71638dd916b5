"""status.capacity carries the KV cache the serving engines report beside the planned one.

From the pure status up: `compute_status` puts the reported value on a copy of
the plan, `reconcile` writes it (and removes it with a null), the capacity
timer's `refresh` keeps it in the operator state, and a real operator process
reads it from the workers' /metrics (vllm:cache_config_info) into status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from frota.api import Capacity
from frota.operator.loop import reconcile as reconcile_module
from frota.operator.loop.children import Children
from frota.operator.loop.desired import desired_state
from frota.operator.loop.reconcile import reconcile, replacing
from frota.operator.loop.state import OperatorState
from frota.operator.reports import kv_report
from frota.operator.reports.observe import Observed
from frota.operator.reports.status import compute_status
from tests.loopback import serving
from tests.operator.conftest import Cluster, FakeApiserver, Operator, sample, wait_for
from tests.operator.loop.test_handlers import converge
from tests.operator.loop.test_retries_and_autoscaling import serve_role_metrics
from tests.operator.reports.test_kv_report import frota_worker_metrics
from tests.operator.reports.test_status import UP, group, intent

VLLM_SCRAPE = (Path(__file__).parents[2] / "fixtures" / "vllm-0.32.0-cpu.metrics").read_bytes()
VLLM_TOKENS = 23296  # block_size 32 x num_gpu_blocks 728
PLANNED = Capacity(weightBytesPerRank=1000, kvCacheTokensPerReplica=33760, maxModelLen=2048,
                   sequencesAtMaxModelLen=16)
KEY = ("default", "tiny")


def planned_capacity(manifest: dict[str, Any]) -> dict[str, Any]:
    """status.capacity as the planner alone makes it for a manifest."""
    body = {**manifest, "metadata": {**manifest["metadata"], "uid": "u", "generation": 1}}
    capacity = desired_state(body).intent.capacity
    assert capacity is not None and capacity.kvCacheTokensPerReplica
    return capacity.to_wire()


# -- compute_status ----------------------------------------------------------------


def test_the_reported_kv_cache_sits_beside_the_planned_capacity() -> None:
    planned = replace(intent(), capacity=PLANNED)
    status = compute_status(planned, Observed((group(0), group(1)), UP), old=None, now="T",
                            reported_kv=VLLM_TOKENS)
    assert status.capacity == PLANNED.model_copy(
        update={"reportedKvCacheTokensPerReplica": VLLM_TOKENS})
    assert PLANNED.reportedKvCacheTokensPerReplica is None  # the plan itself is untouched
    unreported = compute_status(planned, Observed((group(0), group(1)), UP), old=None, now="T")
    assert unreported.capacity == PLANNED
    assert "reportedKvCacheTokensPerReplica" not in unreported.to_wire()["capacity"]


def test_a_report_without_a_plan_is_the_only_capacity_field() -> None:
    status = compute_status(intent(), Observed((group(0),), UP), old=None, now="T",
                            reported_kv=512)
    assert status.to_wire()["capacity"] == {"reportedKvCacheTokensPerReplica": 512}


def test_a_status_patch_removes_what_the_new_status_lacks() -> None:
    old = {"url": "u", "capacity": {"kvCacheTokensPerReplica": 5,
                                    "reportedKvCacheTokensPerReplica": 4}, "mode": "Colocated"}
    new = {"url": "u", "capacity": {"kvCacheTokensPerReplica": 5}}
    assert replacing(new, old) == {
        "url": "u", "capacity": {"kvCacheTokensPerReplica": 5,
                                 "reportedKvCacheTokensPerReplica": None}, "mode": None}
    assert replacing(new, {}) == new


# -- reconcile ---------------------------------------------------------------------


class StatusApi:
    """A fake API that keeps the status patches a reconcile sends."""

    def __init__(self, owner: dict[str, Any]) -> None:
        self.owner = owner
        self.patches: list[dict[str, Any]] = []

    async def get(self, kind: str, namespace: str, name: str) -> Any:
        return self.owner

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "1"}}

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def patch_status(self, kind: str, namespace: str, name: str,
                           status: Mapping[str, Any]) -> None:
        self.patches.append(dict(status))


async def test_reconcile_writes_the_reported_kv_cache_and_removes_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile_module.kopf, "event", lambda *a, **k: None)
    owner = sample("tiny", replicas=1)
    owner["metadata"].update(uid="uid-1", generation=1)
    api = StatusApi(owner)
    children = Children(objects=(), pods=(), endpoint_slices=None)
    plan = planned_capacity(owner)

    first = await reconcile(owner, children, api=api, reported_kv=VLLM_TOKENS)
    assert first.status is not None
    assert api.patches[-1]["capacity"] == {**plan, "reportedKvCacheTokensPerReplica": VLLM_TOKENS}

    again = await reconcile(owner, children, api=api, old_status=first.status)
    assert again.status is not None and again.status.capacity is not None
    assert again.status.capacity.to_wire() == plan
    assert api.patches[-1]["capacity"] == {**plan, "reportedKvCacheTokensPerReplica": None}


# -- the capacity timer's refresh --------------------------------------------------


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """One worker endpoint whose /metrics a test sets (503 while unset)."""
    pages: dict[str, bytes] = {}

    async def metrics(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if "text" not in pages:
            return aiohttp.web.Response(status=503)
        return aiohttp.web.Response(body=pages["text"])

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as base:
        yield f"{base}/metrics", pages


async def test_refresh_keeps_news_drops_it_when_nothing_serves_and_survives_failed_scrapes(
    worker: tuple[str, dict[str, bytes]],
) -> None:
    url, pages = worker
    state = OperatorState()
    serving: list[str] = []
    state.role_metrics_urls = lambda pods, role: list(serving) if role == "worker" else []
    wake = state.wakeup(KEY)

    async def refresh() -> bool:
        wake.clear()
        await kv_report.refresh(state, KEY, "worker", ())
        return wake.is_set()

    assert not await refresh() and KEY not in state.reported_kv  # no metrics session yet
    await state.open()
    try:
        assert await refresh() and state.reported_kv[KEY] is None  # looked: nothing serves
        serving.append(url)
        pages["text"] = VLLM_SCRAPE
        assert await refresh() and state.reported_kv[KEY] == VLLM_TOKENS
        assert not await refresh()  # the same report is no news
        del pages["text"]
        assert not await refresh() and state.reported_kv[KEY] == VLLM_TOKENS  # a failed scrape
        pages["text"] = frota_worker_metrics(100).encode()
        assert await refresh() and state.reported_kv[KEY] == 1600
        serving.clear()
        assert await refresh() and state.reported_kv[KEY] is None
        state.forget(KEY)
        assert KEY not in state.reported_kv
    finally:
        await state.close()


# -- a real operator -----------------------------------------------------------------


def reported(cluster: Cluster, name: str) -> int | None:
    capacity = (cluster.isvc(name).get("status") or {}).get("capacity") or {}
    return capacity.get("reportedKvCacheTokensPerReplica")


def counting_ticks(operator: Operator) -> list[int]:
    """Count the capacity timer's ticks (each asks for the workers' URLs once): [count]."""
    ticks = [0]
    urls = operator.state.role_metrics_urls

    def counted(pods: Iterable[Mapping[str, Any]], role: str) -> list[str]:
        ticks[0] += 1
        return urls(pods, role)
    operator.state.role_metrics_urls = counted
    return ticks


async def test_status_shows_the_kv_cache_a_vllm_worker_reports_beside_the_plan(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    serve_role_metrics(apiserver, operator, worker=VLLM_SCRAPE)
    manifest = sample("tiny", replicas=1)
    await cluster.create_isvc(manifest)
    await converge(cluster, "tiny", 1)
    await wait_for(lambda: reported(cluster, "tiny") == VLLM_TOKENS, what="the reported KV cache")
    capacity = cluster.isvc("tiny")["status"]["capacity"]
    assert capacity == {**planned_capacity(manifest),
                        "reportedKvCacheTokensPerReplica": VLLM_TOKENS}
    assert capacity["kvCacheTokensPerReplica"] != VLLM_TOKENS  # the plan is not overwritten

    # Ticks that read the same report write nothing more.
    ticks = counting_ticks(operator)
    writes = len([w for w in apiserver.writes if w[1].endswith("/tiny/status")])
    await wait_for(lambda: ticks[0] >= 3, what="more ticks")
    await wait_for(lambda: operator.state.pending == 0, what="no reconcile pending")
    assert len([w for w in apiserver.writes if w[1].endswith("/tiny/status")]) == writes


async def test_a_disaggregated_service_reports_its_decode_workers(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    serve_role_metrics(apiserver, operator, prefill=VLLM_SCRAPE,
                       decode=frota_worker_metrics(100).encode())
    await cluster.create_disaggregated()
    await wait_for(lambda: reported(cluster, "pd") == 1600, what="decode's KV cache")


async def test_the_report_goes_when_no_replica_serves(
    cluster: Cluster, apiserver: FakeApiserver, operator: Operator
) -> None:
    serve_role_metrics(apiserver, operator, worker=VLLM_SCRAPE)
    await cluster.create_isvc(sample("tiny", replicas=1))
    await wait_for(lambda: reported(cluster, "tiny") == VLLM_TOKENS, what="the reported KV cache")
    operator.state.role_metrics_urls = lambda pods, role: []  # no ready rank-0 worker left
    await wait_for(lambda: reported(cluster, "tiny") is None, what="the report removed")
    assert cluster.isvc("tiny")["status"]["capacity"]["kvCacheTokensPerReplica"]


async def test_a_restarted_operator_keeps_the_report_without_rewriting_status(
    cluster: Cluster, apiserver: FakeApiserver
) -> None:
    async with Operator(apiserver) as first:
        serve_role_metrics(apiserver, first, worker=VLLM_SCRAPE)
        await cluster.create_isvc(sample("tiny", replicas=1))
        await converge(cluster, "tiny", 1)
        await wait_for(lambda: reported(cluster, "tiny") == VLLM_TOKENS, what="the report")
        await wait_for(lambda: first.state.pending == 0, what="no reconcile pending")
    writes_before = len(apiserver.writes)

    second = Operator(apiserver)
    serve_role_metrics(apiserver, second, worker=VLLM_SCRAPE)
    ticks = counting_ticks(second)
    async with second:
        await wait_for(lambda: ticks[0] >= 2, what="the new operator's capacity ticks")
        await wait_for(lambda: second.state.pending == 0, what="no reconcile pending")
    assert reported(cluster, "tiny") == VLLM_TOKENS
    status_writes = [w for w in apiserver.writes[writes_before:] if w[1].endswith("/status")
                     and "/inferenceservices/" in w[1]]
    assert status_writes == []
