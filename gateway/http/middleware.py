"""The one middleware that renders every error in the envelope of the route's format (see
errors.py ``route_format``): OpenAI's, or Anthropic's on Anthropic's routes.

Only while nothing has been sent: once a handler has started its response, a second one
cannot follow on the same connection (the client would wait for the rest of the first). The
handlers that stream end their own streams with an error event (``gateway.http.sse``); as a
last resort an error that still escapes after the start is re-raised, and aiohttp closes the
connection, so the client sees the cut instead of hanging.
"""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.http.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable, route_error_response
from gateway.keys import METRICS

log = logging.getLogger("palimpsest.errors")

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error", 429: "rate_limit_error"}


@web.middleware
async def error_middleware(request: web.Request, handler):
    def error_response(status: int, message: str, type_: str, param: str | None, code: str | None) -> web.Response:
        return route_error_response(request.path, status, message, type_, param, code)  # the route's envelope

    try:
        return await handler(request)
    except GatewayError as exc:
        if isinstance(exc, (UpstreamUnreachable, UpstreamTimeout)):
            request.app[METRICS].upstream_error(kind="timeout" if isinstance(exc, UpstreamTimeout) else "unreachable")
        if _started(request):
            log.warning("error after the response started; closing the connection", extra={"fields": {"error": type(exc).__name__}})
            raise
        response = error_response(exc.status, exc.message, exc.type, exc.param, exc.code)
        if getattr(exc, "retry_after", None) is not None:
            response.headers["Retry-After"] = str(exc.retry_after)
        if exc.close_connection:
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = _HTTP_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
        code = "request_too_large" if exc.status == 413 else None
        response = error_response(exc.status, exc.reason if exc.text is None else exc.text.removeprefix(f"{exc.status}: "), type_, None, code)
        for name in ("Allow",):
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except web.RequestPayloadError:
        # The body could not be read as sent (a gzip body that does not decode, a broken
        # chunked encoding): the client's error, whatever the handler was doing with it.
        if _started(request):
            raise
        return error_response(400, "The request body could not be decoded as its Content-Encoding says.",
                              "invalid_request_error", None, "invalid_body")
    except Exception:
        # Never the message text or credentials: only the route and the exception type/trace.
        log.exception("unhandled error on %s %s", request.method, request.path)
        if _started(request):
            raise
        return error_response(500, "The gateway failed to handle this request.", "api_error", None, "internal_error")


def _started(request: web.Request) -> bool:
    writer = request.writer
    return writer is not None and writer.output_size > 0
