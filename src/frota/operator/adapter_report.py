"""The LoRA adapters the serving workers have loaded, for status.adapters.

Each worker lists its adapters in GET /v1/models (after the base model, one entry per
adapter with a `parent`; `root` is where it was read from), both runtimes alike: a
listed adapter is loaded there. The capacity timer (`refresh`) reads the list from every
ready rank-0 worker of the serving role, as it reads the KV cache, and keeps the lists in
the operator state; the reconcile loop turns them into status (`adapter_statuses`, pure).

Adapters loaded at run time (through the router's /v1/load_lora_adapter) are listed too:
status records every adapter seen, with its path, so it outlives the pods that have it
(the router loads its recorded runtime adapters onto workers that join). A runtime
adapter no answering replica lists any more was unloaded and leaves status; while no
replica answers (scaled to zero, all restarting) what status says stands.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from frota.api import AdapterStatus
from frota.api.adapters import model_list_adapters

if TYPE_CHECKING:  # status imports the pure half of this module; the state imports status
    from frota.operator.state import Key, OperatorState

# What one serving replica lists: adapter name -> the path it was loaded from (None: unsaid).
Listing = Mapping[str, str | None]


def listed_adapters(models: Any) -> dict[str, str | None] | None:
    """The adapters in one /v1/models body, name -> the path it was read from (None: unsaid),
    or None when the body is not an OpenAI model list."""
    found = model_list_adapters(models)
    if found is None:
        return None
    return {name: root if isinstance(root := entry.get("root"), str) else None
            for name, entry in found.items()}


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
    return metrics_url.removesuffix("/metrics") + "/v1/models"


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


def adapter_statuses(spec_adapters: Sequence[str], lists: Sequence[Listing] | None,
                     old: Sequence[AdapterStatus]) -> list[AdapterStatus]:
    """status.adapters: the spec's adapters in their order, then those loaded at run time
    by name. `lists`: what each answering serving replica lists; None when not read yet (a
    restarted operator), then what status says stands."""
    previous = {a.name: a for a in old}
    if lists is None:
        kept = [previous.get(n) or AdapterStatus(name=n, source="spec") for n in spec_adapters]
        kept = [a.model_copy(update={"source": "spec"}) for a in kept]
        return kept + [a for a in old if a.name not in spec_adapters and a.source == "runtime"]
    out = [_observed(name, "spec", None, lists) for name in spec_adapters]
    seen = sorted({name for found in lists for name in found} - set(spec_adapters))
    for name in seen:
        path = next((found[name] for found in lists if found.get(name)), None)
        out.append(_observed(name, "runtime", path, lists))
    if not lists:  # nothing answers: the runtime adapters status knows stay known
        out += [a.model_copy(update={"residentReplicas": 0, "lastError": None}) for a in old
                if a.source == "runtime" and a.name not in spec_adapters]
    return out


def _observed(name: str, source: str, path: str | None, lists: Sequence[Listing]) -> AdapterStatus:
    resident = sum(1 for found in lists if name in found)
    error = None
    if resident < len(lists):
        error = f"not loaded on {len(lists) - resident} of {len(lists)} serving replicas"
        if source == "spec":
            error += " (see the worker's log for why it failed to load)"
    return AdapterStatus(name=name, source=source, path=path, residentReplicas=resident,
                         lastError=error)
