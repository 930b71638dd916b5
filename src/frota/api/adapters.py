"""`spec.adapters` and `spec.engine.lora`: LoRA adapters served over the one base model.

Decisions (docs/adapters.md says the same to users):

- An adapter's `name` is what clients send as the request's `model`, and it travels in
  worker flags (`--lora-modules name=path`) and directory names, so it is a DNS-style
  token: letters, digits, `.`, `_`, `-`, never `=` or `,`. Names are unique and differ
  from the base model's served name.
- An adapter's `uri` takes the model's schemes (`pvc://CLAIM/PATH`, `hf://ORG/REPO`,
  `https://URL`), each delivered into the pod as the model is, plus `file:///PATH`: a
  directory already on the worker (baked into a custom image; for `frota up`, a path on
  this machine).
- Listing adapters turns LoRA on: with `spec.engine.lora` unset, the defaults below apply
  (as vLLM users expect `--lora-modules` to just work). `spec.engine.lora` set with no
  adapters turns LoRA on for runtime loading only. Neither: LoRA off, no slots reserved.
- `maxRank` is one of vLLM's slot ranks (8 ... 256): an adapter of a lower rank fits a
  slot, one of a higher rank is refused when it loads.
- More adapters than `maxAdapters` is fine: slots are reused least-recently-used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from frota.api.types import FrotaModel

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
ADAPTER_URI_PATTERN = r"^(pvc://[a-z0-9][a-z0-9.-]*/\S+|hf://[^/\s]+/[^/\s]+|https://\S+|file:///\S*)$"
MAX_ADAPTERS_LISTED = 64
LoRARank = Literal[8, 16, 32, 64, 128, 256]


class Adapter(FrotaModel):
    """A LoRA adapter every worker loads at start."""

    name: str = Field(
        min_length=1, max_length=63, pattern=ADAPTER_NAME_PATTERN,
        description=(
            "Served name: the `model` clients send to use this adapter. Letters, digits, "
            "`.`, `_` and `-`; unique, and not the base model's name."
        ),
    )
    uri: str = Field(
        pattern=ADAPTER_URI_PATTERN,
        description=(
            "Where the PEFT adapter directory (adapter_config.json, adapter_model.safetensors) "
            "comes from: `pvc://CLAIM/PATH` mounts the claim read-only; `hf://ORG/REPO` and "
            "`https://URL` are downloaded by an init container, as the model is (with "
            "spec.model.credentials); `file:///PATH` is a directory already on the worker "
            "(a custom image, or this machine under `frota up`)."
        ),
    )


class LoRA(FrotaModel):
    """Adapter slots of each worker: how many adapters are resident at once, at what rank."""

    maxAdapters: int = Field(
        default=4, ge=1, le=256,
        description=(
            "Adapters resident per worker at once (vLLM's --max-loras); more may be loaded, "
            "and slots are reused least-recently-used. The plan reserves this many slots."
        ),
    )
    maxRank: LoRARank = Field(
        default=16,
        description="Rank of each slot (vLLM's --max-lora-rank): adapters of a higher rank are refused.",
    )
    allowRuntimeLoading: bool = Field(
        default=False,
        description=(
            "Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter through the router "
            "(vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING); loaded adapters are shown in status.adapters."
        ),
    )


def model_list_adapters(models: Any) -> dict[str, dict[str, Any]] | None:
    """The adapters in a worker's GET /v1/models body, by name: the entries with a `parent`
    (both runtimes list each loaded adapter so, `root` its path). None when the body is not
    an OpenAI model list (an error page, a proxy's HTML)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    return {m["id"]: m for m in data
            if isinstance(m, dict) and isinstance(m.get("id"), str) and m.get("parent")}
