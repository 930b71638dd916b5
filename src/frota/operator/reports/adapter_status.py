"""status.adapters from what the serving replicas list (pure).

Each worker lists its adapters in GET /v1/models (after the base model, one entry per
adapter with a `parent`; `root` is where it was read from), both runtimes alike: a
listed adapter is loaded there. `frota.operator.reports.adapter_report` reads the lists on the
capacity timer; the reconcile turns them into status here (`adapter_statuses`).

Adapters loaded at run time (through the router's /v1/load_lora_adapter) are listed too:
status records every adapter seen, with its path, so it outlives the pods that have it
(the router loads its recorded runtime adapters onto workers that join). A runtime
adapter no answering replica lists any more was unloaded and leaves status; while no
replica answers (scaled to zero, all restarting) what status says stands.

Apart from the reading half because status needs only this: the reader imports the
operator state, which the reconcile loop (and so status) sits under.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frota.api import AdapterStatus
from frota.api.adapters import model_list_adapters

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
