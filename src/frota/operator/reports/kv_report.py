"""The KV cache the serving engines report, for status.capacity.

The planner's `kvCacheTokensPerReplica` is an estimate made before any pod
runs; the engine sizes its cache from the memory really left after loading
(and vLLM from its own rules), so the two can differ. Both runtimes export
`vllm:cache_config_info`, an info gauge whose labels carry the block size
and the number of blocks allocated; one replica holds their product in
tokens. The operator's capacity timer (`refresh`) reads it from every ready
rank-0 worker of the serving role and keeps the smallest replica's in the
operator state; the InferenceService's reconcile loop writes it to status.
No HTTP happens inside a reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from frota.api.contract import WorkerMetric
from frota.operator.loop.state import Key, OperatorState
from frota.operator.scaling.autoscaler import read_all


def kv_cache_tokens(metrics_text: str) -> int | None:
    """Tokens of KV cache in one /metrics text (block_size x num_gpu_blocks), or None.

    None when the gauge is missing, its labels are not whole numbers (vLLM
    writes "None" before the cache is sized) or the text does not parse. Several
    engines in one process (vLLM's `engine` label) each hold their own cache:
    the smallest counts.
    """
    found: list[int] = []
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name != WorkerMetric.CACHE_CONFIG_INFO:
                    continue
                block_size = _whole(sample.labels.get("block_size"))
                num_blocks = _whole(sample.labels.get("num_gpu_blocks"))
                if block_size is not None and num_blocks is not None:
                    found.append(block_size * num_blocks)
    except (ValueError, TypeError, IndexError, KeyError):
        return None  # not an exposition text (an error page, a proxy's HTML)
    return min(found) if found else None


def _whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdecimal() else None


async def read(session: aiohttp.ClientSession, urls: Sequence[str]) -> int | None:
    """The smallest KV cache, in tokens, among the workers at `urls` that report one
    (scraped at once); None when none does."""
    values = [v for text in await read_all(session, urls)
              if (v := kv_cache_tokens(text)) is not None]
    return min(values) if values else None


async def refresh(state: OperatorState, key: Key, role: str,
                  pods: Sequence[Mapping[str, Any]]) -> None:
    """Read what the serving role's ready rank-0 workers report and, when it changed,
    wake the reconcile loop that writes it to status.

    With no ready worker there is no report (status shows none); when workers
    exist but none answers, the last report stands (a failed scrape is not news).
    """
    if state.http is None:
        return  # not started yet, or shutting down: the metrics session is closed
    urls = state.role_metrics_urls(pods, role)
    tokens = await read(state.http, urls) if urls else None
    if urls and tokens is None:
        return
    if state.report_kv(key, tokens):
        state.poke(key)
