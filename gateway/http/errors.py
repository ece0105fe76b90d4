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
that is not HTTP) never reach the middleware; ``gateway.http.edge`` gives them the same envelope.

The route's format chooses the envelope (``route_format``, the one mapping from route to
format): on Anthropic's routes (``/v1/messages...``) the same errors take Anthropic's envelope,
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


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                   429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


# The wire format each route speaks: the one mapping from route to format. A route is its path
# or anything under it (``/v1/messages/count_tokens``, ``/v1/messages/batches``); every other
# route speaks OpenAI's. The middleware, the edge (parser rejections, which never reach a route)
# and the upstream key header all ask `route_format`, so a route's errors come in its API's
# envelope wherever they are made.
ROUTE_FORMATS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
ANTHROPIC_FORMATS = frozenset({"messages"})  # formats that answer in Anthropic's envelope and read x-api-key


def route_format(path: str) -> str | None:
    """The format of the route `path` (a query string is ignored), None for an OpenAI route
    outside the three formats (``/v1/models``, ``/v1/embeddings``, ...)."""
    path = path.split("?", 1)[0]
    for route, name in ROUTE_FORMATS.items():
        if path == route or path.startswith(route + "/"):
            return name
    return None


def speaks_anthropic(path: str) -> bool:
    return route_format(path) in ANTHROPIC_FORMATS


def anthropic_error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})


def route_error_body(path: str, status: int, message: str, type_: str, param: str | None, code: str | None) -> bytes:
    """The error in the envelope of the API the route `path` speaks."""
    if speaks_anthropic(path):
        return anthropic_error_body(status, message)
    return error_body(message, type_, param, code)


def route_error_response(path: str, status: int, message: str, type_: str, param: str | None = None,
                         code: str | None = None) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, body=route_error_body(path, status, message, type_, param, code),
                        content_type="application/json")
