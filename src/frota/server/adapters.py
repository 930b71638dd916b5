"""LoRA adapters on the worker, as vLLM's OpenAI server offers them.

- `model` picks the adapter: the base model's served name runs the base model, a loaded
  adapter's name runs under that adapter, anything else is 404 `model_not_found`
  (`AdapterRegistry.resolve`). The server keeps its own record of what it loaded (at start
  from `--lora-modules`, at run time through the endpoints below), so resolving a name
  costs no trip to the engine thread.
- `/v1/models` lists the base model, then each adapter with `parent` (the base's id) and
  `root` (its path), as vLLM does.
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
  `POST /v1/unload_lora_adapter {"lora_name"}`: vLLM's routes and answers (200 with a
  plain-text "Success: ..." line), registered only with runtime loading on (else 404, as
  vLLM's server). A bad adapter is a 400 whose message is the engine's `AdapterError`
  (what is wrong: a shape, a target, the rank, a missing or corrupt file, a name taken);
  nothing else changes, so requests in flight on other adapters go on. Unloading a name
  that is not loaded is a 404, as vLLM answers it.
- A `lora_path` (or a `--lora-modules` path) may be an `https://` (or `hf://`) URI: the
  worker downloads it first (`frota.server.fetch`, the code of `frota fetch`, in a thread,
  so requests go on) into $FROTA_ADAPTER_CACHE/NAME, else ~/.cache/frota/adapters/NAME,
  then loads that directory; `/v1/models` shows the URI as its `root`. A failed download
  is a 400 naming the URI, and the engine is not touched. One download per name at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frota.api.adapters import ADAPTER_NAME_PATTERN
from frota.api.contract import ModelScheme
from frota.engine.lora import AdapterError
from frota.server import errors
from frota.server.engine_api import OnlineEngine
from frota.server.fetch import FetchError, fetch_adapter

log = logging.getLogger("frota.server.adapters")

REMOTE_PREFIXES = ("https://", "http://", ModelScheme.HF)  # http:// only to be refused by name


def adapter_cache_dir() -> Path:
    """Where adapters loaded from a URI are downloaded, one directory per name."""
    configured = os.environ.get("FROTA_ADAPTER_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "frota" / "adapters"


@dataclass
class LoRAOptions:
    """The worker's LoRA settings (`--enable-lora`, `--lora-modules`, `--allow-runtime-lora`)."""

    modules: Sequence[tuple[str, str]] = ()  # (name, path), loaded at start, in order
    runtime_loading: bool = False


@dataclass
class AdapterCard:
    """A loaded adapter as `/v1/models` lists it."""

    name: str
    path: str
    created: int = field(default_factory=lambda: int(time.time()))


def from_adapter_error(exc: AdapterError) -> errors.APIError:
    """The answer to a refused adapter: 404 for a name that is not loaded, else a 400."""
    code = getattr(exc, "code", "invalid_adapter")
    if code == "adapter_not_found":
        return errors.APIError(404, str(exc), type="NotFoundError", param="lora_name", code=code)
    return errors.APIError(400, str(exc), param="lora_path" if code == "invalid_adapter"
                           else "lora_name", code=code)


class AdapterRegistry:
    """The adapters this worker serves (name -> card), and the loads and unloads that change it."""

    def __init__(self, base_name: str) -> None:
        self.base_name = base_name
        self.cards: dict[str, AdapterCard] = {}
        self._lock = asyncio.Lock()  # one load or unload at a time: the record follows the engine
        self._downloading: set[str] = set()  # names whose download is under way (outside the lock)

    def resolve(self, model: str) -> str | None:
        """The adapter a request's `model` names (None: the base model); 404 when unknown."""
        if model == self.base_name:
            return None
        if model in self.cards:
            return model
        raise errors.model_not_found(model)

    async def load(self, engine: OnlineEngine, name: str, path: str) -> AdapterCard:
        """Load `path` (a directory, or a URI downloaded first) as `name` into the engine;
        AdapterError when the download fails or the engine refuses it."""
        if name == self.base_name:
            raise AdapterError(f"the name {name!r} is the base model's served name: choose "
                               "another lora_name", "adapter_exists")
        self._check_free(name)
        if not path.startswith(REMOTE_PREFIXES):
            return await self._load(engine, name, path, path)
        self._claim_download(name)
        try:
            local = await self._download(name, path)
            try:
                return await self._load(engine, name, path, local)
            except AdapterError:
                shutil.rmtree(local, ignore_errors=True)  # refused: nothing will read it
                raise
        finally:
            # Held until the engine has read the files, so no second download of this
            # name replaces them mid-read.
            self._downloading.discard(name)

    async def _load(self, engine: OnlineEngine, name: str, path: str, local: str) -> AdapterCard:
        async with self._lock:
            self._check_free(name)
            info = await engine.load_adapter(name, local)
            card = self.cards[name] = AdapterCard(name, path)
        log.info("loaded LoRA adapter", extra={"fields": {
            "adapter": name, "path": path, "rank": info.rank, "targets": list(info.targets)}})
        return card

    def _check_free(self, name: str) -> None:
        if name in self.cards:
            raise AdapterError(f"an adapter named {name!r} is already loaded (from "
                               f"{self.cards[name].path!r}): unload it first or choose "
                               "another lora_name", "adapter_exists")

    def _claim_download(self, name: str) -> None:
        if not re.fullmatch(ADAPTER_NAME_PATTERN, name) or len(name) > 63:
            raise AdapterError(f"the name {name!r} cannot name a download directory: use "
                               "letters, digits, '.', '_' and '-' (at most 63)", "invalid_adapter")
        if name in self._downloading:
            raise AdapterError(f"the LoRA adapter {name!r} is being downloaded by another "
                               "load: wait for it", "adapter_exists")
        self._downloading.add(name)

    async def _download(self, name: str, uri: str) -> str:
        """Download `uri` into the cache directory of `name`, off the event loop; its path."""
        dest = adapter_cache_dir() / name
        try:
            await asyncio.to_thread(fetch_adapter, uri, dest)
        except FetchError as exc:
            raise AdapterError(f"the LoRA adapter {name!r} cannot be downloaded: {exc}",
                               "invalid_adapter") from exc
        except OSError as exc:  # the cache directory: read-only, full
            raise AdapterError(f"the LoRA adapter {name!r} cannot be downloaded: {uri}: "
                               f"cannot write {dest}: {exc}", "invalid_adapter") from exc
        log.info("downloaded LoRA adapter", extra={"fields": {"adapter": name, "uri": uri,
                                                              "path": str(dest)}})
        return str(dest)

    async def unload(self, engine: OnlineEngine, name: str) -> None:
        async with self._lock:
            if name not in self.cards:
                raise AdapterError(f"the LoRA adapter {name!r} cannot be found: no adapter of "
                                   "that name is loaded", "adapter_not_found")
            await engine.unload_adapter(name)
            del self.cards[name]
        log.info("unloaded LoRA adapter", extra={"fields": {"adapter": name}})

    async def load_modules(self, engine: OnlineEngine, modules: Sequence[tuple[str, str]]) -> None:
        """The `--lora-modules` at start; the first bad one raises, naming it."""
        for name, path in modules:
            try:
                await self.load(engine, name, path)
            except AdapterError as exc:
                raise StartupAdapterError(f"--lora-modules {name}={path}: the LoRA adapter "
                                          f"{name!r} cannot be loaded: {exc}") from exc

    def model_cards(self, max_model_len: int | None) -> list[dict[str, Any]]:
        """`/v1/models` entries of the adapters, in load order, as vLLM shapes them."""
        cards = []
        for card in self.cards.values():
            entry: dict[str, Any] = {"id": card.name, "object": "model", "created": card.created,
                                     "owned_by": "frota", "root": card.path,
                                     "parent": self.base_name}
            if max_model_len is not None:
                entry["max_model_len"] = max_model_len
            cards.append(entry)
        return cards


class StartupAdapterError(RuntimeError):
    """A `--lora-modules` adapter the engine refused: the worker does not start."""


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise errors.invalid(f"`{name}` must be a non-empty string.", param=name)
    return value


async def load_from_body(registry: AdapterRegistry, engine: OnlineEngine, body: dict[str, Any]) -> str:
    """`POST /v1/load_lora_adapter`: the success line vLLM answers, or an APIError."""
    name, path = _field(body, "lora_name"), _field(body, "lora_path")
    try:
        await registry.load(engine, name, path)
    except AdapterError as exc:
        raise from_adapter_error(exc) from exc
    return f"Success: LoRA adapter '{name}' added successfully."


async def unload_from_body(registry: AdapterRegistry, engine: OnlineEngine,
                           body: dict[str, Any]) -> str:
    """`POST /v1/unload_lora_adapter`: the success line vLLM answers, or an APIError."""
    name = _field(body, "lora_name")
    try:
        await registry.unload(engine, name)
    except AdapterError as exc:
        raise from_adapter_error(exc) from exc
    return f"Success: LoRA adapter '{name}' removed successfully."
