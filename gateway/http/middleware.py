"""The one middleware that renders every error as the OpenAI envelope (see errors.py)."""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.http.errors import GatewayError, UpstreamTimeout, UpstreamUnreachable, error_response
from gateway.keys import METRICS

log = logging.getLogger("palimpsest.errors")

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error", 429: "rate_limit_error"}


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except GatewayError as exc:
        if isinstance(exc, (UpstreamUnreachable, UpstreamTimeout)):
            request.app[METRICS].upstream_error(kind="timeout" if isinstance(exc, UpstreamTimeout) else "unreachable")
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)
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
    except Exception:
        # Never the message text or credentials: only the route and the exception type/trace.
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "The gateway failed to handle this request.", "api_error", None, "internal_error")
