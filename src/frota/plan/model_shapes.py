"""Known model shapes and what each model URI scheme means for a worker.

A small table, not a hub client: shapes of the aliases baked into the worker
image and of the synthetic presets, enough to check parallel sizes and plan
memory. Models fetched from `hf://`, `https://` or a PVC have unknown shapes
until a worker loads them; the planner then skips the shape checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from frota.api import synthetic
from frota.api.contract import ModelAlias
from frota.api.memory import ModelShape

Delivery = Literal["image", "pvc", "download", "synthetic"]
AdapterDelivery = Literal["pvc", "download", "local"]

MODELS_DIR = "/models"
CACHE_DIR = "/models/cache"
CONVERTED_DIR = "/models/converted"  # HF-layout copies of image-baked models (`frota convert`)
CACHED_CONVERSION = "converted"  # where the model-cache Job writes vLLM's copy, under the cache
ADAPTERS_DIR = "/adapters"  # claims holding adapters are mounted under ADAPTERS_DIR/pvc/CLAIM
ADAPTER_CACHE_DIR = "/adapters/cache"  # downloaded adapters, one directory each


class UnknownModelError(ValueError):
    """The URI names a scheme or alias Frota does not know."""


SMOLLM2_135M = ModelShape(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, tie_word_embeddings=True, max_position=8192,
)

# alias -> shape of the model baked into the worker image.
ALIASES: dict[str, ModelShape] = {ModelAlias.SMOLLM2: SMOLLM2_135M}


def synthetic_shape(spec: str) -> ModelShape:
    """The shape of `synthetic:SPEC`, from the parser the engine uses."""
    try:
        values = synthetic.parse_synthetic_spec(spec)
    except synthetic.SyntheticSpecError as exc:
        raise UnknownModelError(str(exc)) from None
    return synthetic.synthetic_shape(values)


@dataclass(frozen=True)
class ModelLocation:
    """How a URI reaches a worker: the `--model` argument and how the files get there."""

    uri: str
    model_arg: str
    delivery: Delivery
    shape: ModelShape | None
    pvc_claim: str | None = None


def locate(uri: str) -> ModelLocation:
    """Map a model URI to the worker's `--model` and its delivery (docs/internals.md)."""
    scheme, sep, rest = uri.partition(":")
    if not sep:
        raise UnknownModelError(f"{uri!r} has no scheme; use alias:, pvc://, hf://, https:// or synthetic:")
    if scheme == "alias":
        if rest not in ALIASES:
            raise UnknownModelError(
                f"unknown alias {rest!r}; the worker image bakes in: {', '.join(sorted(ALIASES))}"
            )
        return ModelLocation(uri, rest, "image", ALIASES[rest])
    if scheme == "synthetic":
        return ModelLocation(uri, uri, "synthetic", synthetic_shape(rest))
    if scheme == "pvc":
        claim, _, path = rest.removeprefix("//").partition("/")
        if not claim:
            raise UnknownModelError(f"{uri!r} names no claim; use pvc://CLAIM/PATH")
        return ModelLocation(uri, f"{MODELS_DIR}/{path}".rstrip("/"), "pvc", None, pvc_claim=claim)
    if scheme == "hf":
        repo = rest.removeprefix("//")
        return ModelLocation(uri, f"{CACHE_DIR}/{repo}", "download", None)
    if scheme == "https":
        filename = rest.rstrip("/").rsplit("/", 1)[-1].split("#", 1)[0].split("?", 1)[0] or "model"
        return ModelLocation(uri, f"{CACHE_DIR}/{filename}", "download", None)
    raise UnknownModelError(
        f"unknown scheme {scheme!r}; use alias:, pvc://, hf://, https:// or synthetic:"
    )


@dataclass(frozen=True)
class AdapterLocation:
    """How one LoRA adapter reaches a worker: the path in its `--lora-modules name=path`
    and how the directory gets there (as the model's, into a directory of its own)."""

    name: str
    uri: str
    path: str
    delivery: AdapterDelivery
    pvc_claim: str | None = None


def locate_adapter(name: str, uri: str) -> AdapterLocation:
    """Map an adapter URI (spec.adapters[].uri) to the worker's local path and its delivery.

    `pvc://CLAIM/PATH` is the claim mounted read-only at ADAPTERS_DIR/pvc/CLAIM;
    `hf://` and `https://` are downloaded into ADAPTER_CACHE_DIR/NAME; `file:///PATH` is
    PATH on the worker itself.
    """
    scheme, sep, rest = uri.partition("://")
    if scheme == "pvc" and sep:
        claim, _, path = rest.partition("/")
        if not claim or not path:
            raise UnknownModelError(f"{uri!r}: use pvc://CLAIM/PATH (the adapter's directory in the claim)")
        return AdapterLocation(name, uri, f"{ADAPTERS_DIR}/pvc/{claim}/{path}".rstrip("/"), "pvc", claim)
    if scheme in ("hf", "https") and sep:
        return AdapterLocation(name, uri, f"{ADAPTER_CACHE_DIR}/{name}", "download")
    if scheme == "file" and sep and rest.startswith("/"):
        return AdapterLocation(name, uri, rest.rstrip("/") or "/", "local")
    raise UnknownModelError(f"{uri!r}: use pvc://CLAIM/PATH, hf://ORG/REPO, https://URL or file:///PATH")
