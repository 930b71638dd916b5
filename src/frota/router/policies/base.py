"""The one interface every routing policy implements."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from frota.router.health import Worker


class PolicyName(StrEnum):
    """The `--policy` values."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOAD = "least-load"
    PREFIX_AWARE = "prefix-aware"
    SESSION = "session"


@dataclass
class RouteRequest:
    """What a policy may look at: the endpoint, the headers and the (lazily parsed) body.

    `adapter` is the LoRA adapter the request's `model` names, when the router knows it
    as one (`frota.router.adapters`); None for the base model."""

    path: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    adapter: str | None = None

    @cached_property
    def json(self) -> dict[str, Any]:
        """The request body as JSON; an empty dict when it is not a JSON object."""
        try:
            parsed = json.loads(self.body) if self.body else {}
        except (ValueError, UnicodeDecodeError):
            return {}
        return parsed if isinstance(parsed, dict) else {}

    @cached_property
    def prompt_text(self) -> str:
        """The prompt as one string, for prefix hashing.

        Completions: the `prompt` (the first one when a list; token ids are joined
        as text). Chat: each message as `role` + newline + content, separated by
        NUL, which keeps the leading messages (system prompt, earlier turns) a
        stable prefix of later turns' text.
        """
        body = self.json
        if "messages" in body and isinstance(body["messages"], list):
            parts = []
            for message in body["messages"]:
                if not isinstance(message, dict):
                    continue
                content = message.get("content", "")
                if isinstance(content, list):  # content parts: keep the text ones
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(f"{message.get('role', '')}\n{content}")
            return "\x00".join(parts)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt and isinstance(prompt[0], (str, list)) else prompt
            if isinstance(prompt, list):
                prompt = " ".join(str(t) for t in prompt)
        return prompt if isinstance(prompt, str) else str(prompt)


@dataclass(slots=True)
class Decision:
    """A policy's choice and why (the `decision` label of the routing metric). Made once
    per request, so slotted and not frozen: a frozen dataclass's `__init__` costs three
    times as much."""

    worker: Worker
    reason: str


class RoutingPolicy(ABC):
    """Choose one worker for a request among healthy candidates.

    `choose` is synchronous and cheap in every policy: it runs on the request
    path, once per attempt. `candidates` is never empty and excludes workers this
    request already failed on. Policies that learn (prefix, session) update their
    state in `choose`; they must tolerate workers appearing and vanishing.
    """

    name: PolicyName
    #: True when the policy wants the workers' scraped `/metrics` load.
    needs_worker_metrics: bool = False
    #: True when the policy reads the request body (so the app parses it).
    needs_body: bool = False

    @abstractmethod
    def choose(self, request: RouteRequest, candidates: Sequence[Worker]) -> Decision:
        """Pick a worker from `candidates` (non-empty, stable order)."""
