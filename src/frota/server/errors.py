"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from frota.api.openai_requests import refusal
from frota.engine.errors import InvalidRequestError


class APIError(Exception):
    """An error that reaches the client as an OpenAI-shaped JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine(exc: InvalidRequestError) -> APIError:
    """The 400 for a request the engine refused, with the field and code it named."""
    return invalid(exc.message, param=exc.param, code=exc.code)


def model_not_found(name: str) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist.",
        type="NotFoundError",
        param="model",
        code="model_not_found",
    )


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="service_unavailable",
                    headers={"Retry-After": "1"})


def queue_full(retry_after_s: int) -> APIError:
    return APIError(
        429,
        "The worker's waiting queue is full; retry after a short delay.",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def internal(message: str) -> APIError:
    return APIError(500, message, type="internal_error", code="internal_error")


def from_validation_error(exc: ValidationError) -> APIError:
    message, param = refusal(exc)
    return invalid(message, param=param)


def from_json_error(exc: json.JSONDecodeError | UnicodeDecodeError) -> APIError:
    return invalid(f"The request body is not valid JSON ({exc}).", param="body", code="invalid_json")
