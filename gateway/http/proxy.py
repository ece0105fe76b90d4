"""Pass-through for every /v1/* route other than chat completions: any method, bodies
streamed both ways, nothing stored. Compressed upstream bodies are relayed as they came."""

from __future__ import annotations

import time

from aiohttp import web

from gateway.keys import METRICS, REQUEST_ID, UPSTREAM
from gateway.http.upstream import response_headers

ROUTE = "passthrough"


async def passthrough(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM]
    metrics = request.app[METRICS]
    started = time.perf_counter()
    waited = 0.0
    headers = upstream.request_headers(request.headers)
    body = None
    if request.body_exists:
        body = request.content
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
    status = 502
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
            while True:
                t0 = time.perf_counter()
                chunk = await up.content.readany()
                waited += time.perf_counter() - t0
                if not chunk:
                    break
                await response.write(chunk)
            await response.write_eof()
            return response
    finally:
        elapsed = time.perf_counter() - started
        metrics.requests.labels(ROUTE, "none", str(status)).inc()
        metrics.request_seconds.labels(ROUTE, "none").observe(elapsed)
        metrics.upstream_seconds.labels(ROUTE, "none").observe(waited)
        metrics.overhead_seconds.labels(ROUTE).observe(max(0.0, elapsed - waited))
