"""The LoRA adapters the serving workers have loaded, read for status.adapters.

The capacity timer (`refresh`) reads GET /v1/models from every ready rank-0 worker of the
serving role, as it reads the KV cache, and keeps the lists in the operator state; the
reconcile loop turns them into status (`frota.operator.reports.adapter_status`, pure).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from frota.api.contract import ServingPath
from frota.operator.loop.state import Key, OperatorState
from frota.operator.reports.adapter_status import Listing, listed_adapters


async def read_models(session: aiohttp.ClientSession, url: str) -> dict[str, str | None] | None:
    """One worker's adapters; None when it does not answer with a model list."""
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            return listed_adapters(json.loads(await resp.text()))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None


def models_url(metrics_url: str) -> str:
    """A worker's /v1/models, beside the /metrics the capacity timer reads."""
    return metrics_url.removesuffix(ServingPath.METRICS) + ServingPath.MODELS


async def read(session: aiohttp.ClientSession, urls: Sequence[str]) -> tuple[Listing, ...]:
    """The lists of the workers at `urls` (/metrics URLs) that answered, read at once."""
    lists = await asyncio.gather(*(read_models(session, models_url(u)) for u in urls))
    return tuple(found for found in lists if found is not None)


async def refresh(state: OperatorState, key: Key, role: str,
                  pods: Sequence[Mapping[str, Any]]) -> None:
    """Read the serving role's ready rank-0 workers' adapters; wake the reconcile loop when
    that is news. With no ready worker the report is empty; when workers exist but none
    answers, the last report stands (a failed read is not news)."""
    if state.http is None:
        return
    urls = state.role_metrics_urls(pods, role)
    lists = await read(state.http, urls) if urls else ()
    if urls and not lists:
        return
    if state.report_adapters(key, lists):
        state.poke(key)
