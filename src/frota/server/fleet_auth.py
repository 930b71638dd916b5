"""Who may call a worker's internal endpoints: only the fleet's own parts.

A worker's internal endpoints (`/internal/*`: the KV prefill, the KV block stream and its
layout; and the adapter load and unload routes) act for the fleet, not for a client: they
pin memory, stream KV bytes, load code-adjacent files. Each call must carry the fleet's
credential (`frota.api.fleet_key`), which the router and the other workers have and a
client never does; the NetworkPolicy that admits only the fleet's pods is the second wall.

A worker started without a fleet key is a worker on its own: its `/internal/*` endpoints
answer 403, and its adapter routes stay as vLLM serves them (open, or behind `--api-key`).

Refusals say only that the endpoint is internal: nothing about what was expected.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from frota.api.contract import InternalHeader, WorkerPath
from frota.api.fleet_key import Keyring
from frota.server import errors

log = logging.getLogger("frota.server.auth")

FLEET_ONLY_PATHS = frozenset({WorkerPath.LOAD_LORA_ADAPTER, WorkerPath.UNLOAD_LORA_ADAPTER})
# Set on a request that carried the fleet's credential (the API-key check then stands aside).
FROM_FLEET = web.RequestKey("from_fleet", bool)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_id(request: web.Request) -> str:
    """The id the router gave the request (and the client got back), for log lines; '-'
    when there is none or it is not a plain token (a log line is no place for a client's
    bytes)."""
    given = request.headers.get(InternalHeader.REQUEST_ID, "")
    return given if _REQUEST_ID.fullmatch(given) else "-"


def forbidden(message: str, code: str = "forbidden") -> errors.APIError:
    return errors.APIError(403, message, type="permission_error", code=code)


def middleware(keyring: Keyring | None):  # type: ignore[no-untyped-def]
    """The check in front of every route: internal paths need the fleet's credential."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        internal = path.startswith(WorkerPath.INTERNAL_PREFIX)
        if not internal and path not in FLEET_ONLY_PATHS:
            return await handler(request)
        if keyring is None:
            if internal:
                raise forbidden("This endpoint is internal to a fleet, and this worker has no "
                                "fleet key.")
            return await handler(request)  # a worker on its own: vLLM's adapter routes
        if not keyring.accepts_authorization(request.headers.get("Authorization")):
            log.warning("refused %s %s without the fleet's credential (request %s)",
                        request.method, path, request_id(request))
            raise forbidden("This endpoint is internal to the fleet.")
        request[FROM_FLEET] = True
        return await handler(request)

    return check
