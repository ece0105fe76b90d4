"""The simulated provider's errors: one type, rendered once as the OpenAI envelope.

See docs/architecture.md ("The simulator").
"""

from __future__ import annotations

import hashlib
import time

import orjson
from aiohttp import web

SIMULATED_NOTICE = "SIMULATED provider (palimpsest puppet): answers are scripted, not generated"

_ERROR_KINDS = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_denied_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "not_found", "Not found."),
    408: ("timeout_error", "timeout", "Request timed out."),
    409: ("invalid_request_error", "conflict", "Conflict."),
    413: ("invalid_request_error", "request_too_large", "Request too large."),
    422: ("invalid_request_error", "unprocessable_entity", "Unprocessable entity."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded."),
    504: ("server_error", "timeout", "Gateway timeout."),
}


class PuppetError(Exception):
    def __init__(
        self,
        status: int,
        message: str | None = None,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        kind, default_code, default_message = _ERROR_KINDS.get(status, ("api_error", None, "Error."))
        self.status = status
        self.message = message or f"{default_message} ({SIMULATED_NOTICE})"
        self.type = type or kind
        self.param = param
        self.code = code if code is not None else default_code
        self.headers = headers or {}
        super().__init__(self.message)

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
        return web.Response(status=self.status, body=orjson.dumps(body), headers=self.headers,
                            content_type="application/json")


def injected_failure(status: int) -> PuppetError:
    headers = {}
    if status == 429:
        headers = {"retry-after": "1", "x-ratelimit-remaining-requests": "0",
                   "x-ratelimit-limit-requests": "10000", "x-ratelimit-reset-requests": "1s"}
    return PuppetError(status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    request_id = f"req_{hashlib.sha256(f'{id(request)}{time.monotonic_ns()}'.encode()).hexdigest()[:24]}"
    try:
        response = await handler(request)
    except PuppetError as exc:
        response = exc.response()
    except web.HTTPException as exc:
        response = PuppetError(exc.status, exc.reason).response()
    if not response.prepared:
        response.headers.setdefault("x-request-id", request_id)
        response.headers.setdefault("x-simulated-provider", "palimpsest-puppet")
    return response



def invalid(message: str, param: str | None = None, code: str | None = None) -> PuppetError:
    """A 400 invalid_request_error, the way the provider words its structural complaints."""
    return PuppetError(400, message, type="invalid_request_error", param=param, code=code)
