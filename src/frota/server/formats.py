"""OpenAI response shapes for the two generation endpoints.

One `Format` per endpoint turns engine deltas into stream chunks and finished
choices into the non-streamed body; the generation loop is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (token id, its logprob, [(top token id, logprob), ...]) for one token; an echoed prompt's
# first token has neither (None, None).
TokenLogprob = tuple[int, float | None, list[tuple[int, float]] | None]


@dataclass
class Choice:
    """What one engine request produced, accumulated for a non-streamed reply."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Format:
    """Base: the fields every response carries."""

    object_name = ""
    chunk_object_name = ""

    def __init__(self, request_id: str, model: str, created: int,
                 decode: Callable[[list[int]], str], want_logprobs: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self.decode = decode
        self.want_logprobs = want_logprobs

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model}

    def usage_chunk(self, usage_: dict[str, int]) -> dict[str, Any]:
        return {**self._envelope(self.chunk_object_name), "choices": [], "usage": usage_}

    def opening_chunks(self, num_choices: int) -> list[dict[str, Any]]:
        return []

    def chunk(self, index: int, text: str, logprobs: list[TokenLogprob],
              finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def chunks(self, index: int, text: str, logprobs: list[TokenLogprob],
               finish_reason: str | None) -> list[dict[str, Any]]:
        """The stream chunks for one engine output (one, unless a format holds text back)."""
        return [self.chunk(index, text, logprobs, finish_reason)]

    def body(self, choices: list[Choice], usage_: dict[str, int]) -> dict[str, Any]:
        raise NotImplementedError

    def _token(self, token_id: int) -> str:
        return self.decode([token_id])


class CompletionFormat(Format):
    """`/v1/completions`: `text_completion` objects, legacy logprobs layout."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def _logprobs(self, entries: list[TokenLogprob], text_offset: int) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        tokens, token_logprobs, tops, offsets = [], [], [], []
        offset = text_offset
        for token_id, logprob, top in entries:
            token = self._token(token_id)
            tokens.append(token)
            token_logprobs.append(logprob)
            tops.append(None if top is None else {self._token(t): lp for t, lp in top})
            offsets.append(offset)
            offset += len(token)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
                "text_offset": offsets}

    def chunk(self, index: int, text: str, logprobs: list[TokenLogprob],
              finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": self._logprobs(logprobs, 0),
                  "finish_reason": finish_reason}
        return {**self._envelope(self.chunk_object_name), "choices": [choice]}

    def body(self, choices: list[Choice], usage_: dict[str, int]) -> dict[str, Any]:
        out = [{"index": c.index, "text": c.text, "logprobs": self._logprobs(c.logprobs, 0),
                "finish_reason": c.finish_reason} for c in choices]
        return {**self._envelope(self.object_name), "choices": out, "usage": usage_}


class ChatFormat(Format):
    """`/v1/chat/completions`: assistant messages, per-token logprob objects."""

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self._token(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        content = [{**self._entry(t, lp), "top_logprobs": [self._entry(i, v) for i, v in top]}
                   for t, lp, top in entries]
        return {"content": content}

    def opening_chunks(self, num_choices: int) -> list[dict[str, Any]]:
        return [{**self._envelope(self.chunk_object_name),
                 "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}]}
                for i in range(num_choices)]

    def chunk(self, index: int, text: str, logprobs: list[TokenLogprob],
              finish_reason: str | None) -> dict[str, Any]:
        delta = {"content": text} if text or finish_reason is None else {}
        choice = {"index": index, "delta": delta, "logprobs": self._logprobs(logprobs),
                  "finish_reason": finish_reason}
        return {**self._envelope(self.chunk_object_name), "choices": [choice]}

    def body(self, choices: list[Choice], usage_: dict[str, int]) -> dict[str, Any]:
        out = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": self._logprobs(c.logprobs), "finish_reason": c.finish_reason}
               for c in choices]
        return {**self._envelope(self.object_name), "choices": out, "usage": usage_}
