"""Errors, rendered once, by one middleware, as the OpenAI envelope.

    GatewayError                  base: status 500, type "api_error"
    ├── BadRequest                400 invalid_request_error (malformed JSON, wrong types)
    │   └── ContextLengthExceeded 400 code context_length_exceeded (cannot fit even tailored)
    ├── Unauthorized              401 (a missing or unknown client key; the admin API)
    ├── Forbidden                 403 (a pass-through route the operator's key may not serve)
    ├── NotFound                  404
    ├── RequestTimeout            408 (the request body did not arrive in time; closes the connection)
    ├── PayloadTooLarge           413
    ├── UnsupportedEncoding       415 (a Content-Encoding the gateway cannot decode)
    ├── StorageQuotaExceeded      429 insufficient_quota (the tenant's stored messages fill its quota)
    ├── UpstreamUnreachable       502 (refused, reset, malformed)
    │   ├── UpstreamIncomplete    502 (the stream ended before its finish_reason)
    │   └── UpstreamErrorEvent    502 (the provider's error event inside a stream, relayed as it said it)
    └── UpstreamTimeout           504 (connect, first byte or idle timeout)

Raised before the client's response started, an error becomes that response. Raised after a
stream started, it is told as the stream's last event instead (``gateway.http.sse``).

Requests aiohttp rejects before any handler runs (a header over its size limit, a request line
that is not HTTP) never reach the middleware; ``gateway.http.protocol_errors`` gives them the
same envelope.

On Anthropic's routes (``/v1/messages...``) the same errors take Anthropic's envelope,
``{"type": "error", "error": {"type", "message"}}``, with its type names (``anthropic_error_type``).

Upstream error responses are not GatewayErrors: they are relayed as they came (status, body
and rate-limit headers), because clients retry on exactly what the provider said.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:  # imported where used: CLI tools import the error types without the HTTP stack
    from aiohttp import web


class GatewayError(Exception):
    status = 500
    type = "api_error"
    code: str | None = None
    close_connection = False  # the rest of the request cannot be trusted to follow on this connection

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"
    code = "route_not_allowed"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    close_connection = True  # the body is still owed: the connection cannot carry another request


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class StorageQuotaExceeded(GatewayError):
    status = 429
    type = "insufficient_quota"
    code = "storage_quota_exceeded"


class RateLimited(GatewayError):
    """A tenant over its request rate (gateway/pipeline/limits.py); `retry_after` seconds until
    its next request is admitted (the Retry-After header)."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamUnreachable(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamIncomplete(UpstreamUnreachable):
    code = "upstream_incomplete"


class UpstreamErrorEvent(UpstreamUnreachable):
    """The provider's own ``data: {"error": ...}`` event in the middle of a stream the gateway
    rewrites (the recall loop): told to the client with the provider's message, type and code."""

    code = "upstream_error_event"

    def __init__(self, error: dict) -> None:
        message = error.get("message")
        super().__init__(message if isinstance(message, str) else "The upstream reported an error in its stream.")
        if isinstance(error.get("type"), str):
            self.type = error["type"]
        if isinstance(error.get("param"), str):
            self.param = error["param"]
        # The client is told the provider's code; `code` stays ours (a bounded metrics label).
        self.told_code = error.get("code") if isinstance(error.get("code"), (str, int)) else None


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def error_response(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, body=error_body(message, type_, param, code), content_type="application/json")


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                   429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def is_anthropic_route(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error_response(status: int, message: str) -> web.Response:
    from aiohttp import web

    body = orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})
    return web.Response(status=status, body=body, content_type="application/json")
