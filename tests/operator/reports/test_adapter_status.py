"""status.adapters from a real operator: the capacity timer reads each serving worker's
/v1/models, and the reconcile loop writes every adapter seen (spec or runtime-loaded)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest

from tests.loopback import serving
from tests.operator.conftest import Cluster, Operator, sample, wait_for
from tests.operator.reports.test_adapter_report import models
from tests.operator.reports.test_kv_report import frota_worker_metrics

ADAPTERS = [{"name": "sql", "uri": "pvc://loras/sql"}, {"name": "tone", "uri": "hf://org/tone"}]


class Workers:
    """Fake serving workers: /wN/metrics and /wN/v1/models, the lists set by the test."""

    def __init__(self) -> None:
        self.lists: dict[str, list[tuple[str, str]]] = {}
        self.base = ""

    def urls(self) -> list[str]:
        return [f"{self.base}/{w}/metrics" for w in sorted(self.lists)]

    async def metrics(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=frota_worker_metrics(100))

    async def v1_models(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        listed = self.lists.get(request.match_info["worker"])
        if listed is None:
            return aiohttp.web.Response(status=404)
        return aiohttp.web.Response(text=json.dumps(models(*listed)), content_type="application/json")


@pytest.fixture
async def workers(operator: Operator) -> AsyncIterator[Workers]:
    fake = Workers()
    app = aiohttp.web.Application()
    app.router.add_get("/{worker}/metrics", fake.metrics)
    app.router.add_get("/{worker}/v1/models", fake.v1_models)
    async with serving(app) as base:
        fake.base = base
        operator.state.role_metrics_urls = lambda pods, role: fake.urls() if role == "worker" else []
        yield fake


def adapters(cluster: Cluster, name: str) -> list[dict[str, Any]] | None:
    return (cluster.isvc(name).get("status") or {}).get("adapters")


async def test_status_counts_resident_replicas_and_records_runtime_loads(
    cluster: Cluster, operator: Operator, workers: Workers
) -> None:
    workers.lists = {"w0": [("sql", "/adapters/pvc/loras/sql")], "w1": []}
    await cluster.create_isvc(sample("tiny", replicas=2, adapters=ADAPTERS))
    await wait_for(lambda: (adapters(cluster, "tiny") or [{}])[0].get("residentReplicas") == 1,
                   what="sql resident on one replica")
    sql, tone = adapters(cluster, "tiny")
    assert (sql["name"], sql["source"], tone["name"], tone["residentReplicas"]) == ("sql", "spec", "tone", 0)
    assert tone["lastError"].startswith("not loaded on 2 of 2 serving replicas")

    # An adapter loaded at run time (through the router) shows up, with its path.
    workers.lists = {"w0": [("sql", "/a/sql"), ("tone", "/a/tone"), ("zeta", "/tmp/zeta")],
                     "w1": [("sql", "/a/sql"), ("tone", "/a/tone"), ("zeta", "/tmp/zeta")]}
    await wait_for(lambda: len(adapters(cluster, "tiny") or []) == 3, what="the runtime adapter")
    zeta = adapters(cluster, "tiny")[2]
    assert zeta == {"name": "zeta", "source": "runtime", "path": "/tmp/zeta", "residentReplicas": 2}
    assert all("lastError" not in a for a in adapters(cluster, "tiny"))

    # Scaled to nothing serving: the runtime adapter stays recorded for the next workers.
    workers.lists = {}
    await wait_for(lambda: adapters(cluster, "tiny")[2]["residentReplicas"] == 0, what="none resident")
    assert [a["name"] for a in adapters(cluster, "tiny")] == ["sql", "tone", "zeta"]


async def test_a_fleet_without_lora_has_no_adapters_in_status(
    cluster: Cluster, operator: Operator, workers: Workers
) -> None:
    workers.lists = {"w0": []}
    await cluster.create_isvc(sample("plain", replicas=1))
    await wait_for(lambda: (cluster.isvc("plain").get("status") or {}).get("capacity", {})
                   .get("reportedKvCacheTokensPerReplica") == 1600, what="the capacity report")
    assert adapters(cluster, "plain") is None
