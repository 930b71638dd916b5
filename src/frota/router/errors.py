"""JSON answers, and OpenAI-shaped error bodies (the same shape the workers answer with)."""

from __future__ import annotations

import json
from typing import Any

from frota.router.server import Response

JSON = ("Content-Type", "application/json; charset=utf-8")


def json_response(payload: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> Response:
    response = Response(status, json.dumps(payload).encode(), headers or ())
    response.headers.append(JSON)
    return response


def error_body(message: str, type_: str, code: str | int | None = None,
               param: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str | int | None = None,
                   *, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """A JSON error response in the OpenAI shape."""
    return json_response(error_body(message, type_, code, param), status=status,
                         headers=headers)


def sse_error_event(message: str, type_: str = "upstream_error", code: str | int = 502) -> bytes:
    """An SSE event carrying an OpenAI error (the `openai` client raises on it), then
    `[DONE]` so plain SSE readers stop too."""
    payload = json.dumps(error_body(message, type_, code))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
