"""JSON answers, and OpenAI-shaped error bodies (the same shape the workers answer with)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


def json_response(payload: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status, headers=headers,
                        content_type="application/json", charset="utf-8")


def error_body(message: str, type_: str, code: str | int | None = None,
               param: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str | int | None = None,
                   *, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error response in the OpenAI shape."""
    return json_response(error_body(message, type_, code, param), status=status,
                         headers=headers)


def refusal(status: int, message: str, code: str) -> web.Response:
    """An answer the router gives on its own (bad requests, limits, crashes)."""
    type_ = "internal_error" if status >= 500 else "invalid_request_error"
    return error_response(status, message, type_, code)


def sse_error_event(message: str, type_: str = "upstream_error", code: str | int = 502) -> bytes:
    """An SSE event carrying an OpenAI error (the `openai` client raises on it), then
    `[DONE]` so plain SSE readers stop too."""
    payload = json.dumps(error_body(message, type_, code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
