"""The fleet's request validation, in front of a runtime that validates differently.

Frota's workers parse every body with `frota.api.openai_requests`; vLLM accepts some
bodies they refuse (a message with an unknown role, a user message with `content: null`)
and then runs them. With `--validate-requests` (the plan sets it for `runtime.engine:
vllm`) the router checks completions and chat bodies against the same models first and
answers the same 400, so a fleet refuses the same requests whatever its runtime. In
front of Frota's workers it stays off: they validate anyway, and the router's hot path
does not parse bodies it need not read.

Only the schema is checked; what an engine cannot honour (`unsupported()`) is the
engine's to say.
"""

from __future__ import annotations

from pydantic import ValidationError

from frota.api.openai_requests import REQUEST_MODELS, refusal
from frota.router.errors import error_response
from frota.router.server import Response


def refused(path: str, body: bytes) -> Response | None:
    """The 400 for a body of `path` the fleet's models refuse; None when it passes or
    `path` has no model."""
    model = REQUEST_MODELS.get(path)
    if model is None:
        return None
    try:
        model.model_validate_json(body)
    except ValidationError as exc:
        if exc.errors(include_url=False)[0]["type"] in ("json_invalid", "model_type"):
            return error_response(400, "the request body is not a JSON object",
                                  "invalid_request_error", "invalid_json", param="body")
        message, param = refusal(exc)
        return error_response(400, message, "invalid_request_error", param=param)
    return None
