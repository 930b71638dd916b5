"""What the LoRA parts tell a caller: the error of a bad adapter request and an adapter's
description. Torch-free, so the server imports them without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass


class AdapterError(ValueError):
    """A bad adapter or adapter request; the message names what is wrong.

    `code`: "invalid_adapter" (a file, its shapes, targets or rank), "adapter_exists" (the
    name is taken), "adapter_not_found" (no adapter of that name is loaded) or
    "lora_disabled" (the engine was started with max_loras 0).
    """

    def __init__(self, message: str, code: str = "invalid_adapter") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AdapterInfo:
    """A loaded adapter as `LLMEngine.adapters()` lists it; `resident`: it holds a slot now."""

    name: str
    path: str
    rank: int
    targets: tuple[str, ...]
    resident: bool
