"""Pass-through for every /v1/* route other than chat completions: any method, bodies
streamed both ways, nothing stored. Compressed upstream bodies are relayed as they came.

An upstream failure before the response started is an error status (middleware); after, an
event stream ends with an error event, and any other body is cut off by closing the
connection, so the client sees a truncated body instead of waiting for the rest.
"""

from __future__ import annotations

import time

from aiohttp import web

from gateway.http.errors import GatewayError, UpstreamTimeout
from gateway.http.sse import end_with_error
from gateway.http.upstream import response_headers
from gateway.keys import IDENTITY, METRICS, REQUEST_ID, UPSTREAM

ROUTE = "passthrough"


async def passthrough(request: web.Request) -> web.StreamResponse:
    request.app[IDENTITY].tenant(request)  # 401 here for a missing/unknown client key
    upstream = request.app[UPSTREAM]
    metrics = request.app[METRICS]
    started = time.perf_counter()
    waited = 0.0
    headers = upstream.request_headers(request.headers)
    body = None
    if request.body_exists:
        body = request.content
        if request.content_length is not None and "Content-Encoding" not in request.headers:
            headers["Content-Length"] = str(request.content_length)  # decoded bodies go chunked
    status = 502
    response: web.StreamResponse | None = None
    try:
        t0 = time.perf_counter()
        async with upstream.request(
            upstream.raw, request.method, upstream.url(request.path, request.query_string), headers=headers, data=body
        ) as up:
            waited += time.perf_counter() - t0
            status = up.status
            if status >= 400:
                metrics.upstream_error(status)
            response = web.StreamResponse(status=up.status, reason=up.reason, headers=response_headers(up.headers, decoded=False))
            response.headers["x-request-id"] = request.get(REQUEST_ID, "")
            if up.content_length is not None and request.method != "HEAD":
                response.content_length = up.content_length
            await response.prepare(request)
            reader = upstream.reader(up)
            while True:
                t0 = time.perf_counter()
                chunk = await reader.chunk()
                waited += time.perf_counter() - t0
                if not chunk:
                    break
                await response.write(chunk)
            await response.write_eof()
            return response
    except GatewayError as exc:
        status = exc.status
        if response is None or not response.prepared:
            raise
        metrics.upstream_error(kind="timeout" if isinstance(exc, UpstreamTimeout) else "unreachable")
        if "text/event-stream" in response.headers.get("Content-Type", ""):
            await end_with_error(response, exc)
        else:
            response.force_close()
            if request.transport is not None:
                request.transport.close()  # the body stays short: the client sees it cut, not complete
        return response
    finally:
        elapsed = time.perf_counter() - started
        metrics.requests.labels(ROUTE, "none", str(status)).inc()
        metrics.request_seconds.labels(ROUTE, "none").observe(elapsed)
        metrics.upstream_seconds.labels(ROUTE, "none").observe(waited)
        metrics.overhead_seconds.labels(ROUTE).observe(max(0.0, elapsed - waited))
