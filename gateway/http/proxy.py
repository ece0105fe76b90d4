"""Pass-through for every /v1/* route other than chat completions: any method, bodies
streamed both ways, nothing stored. Compressed upstream bodies are relayed as they came.

With the operator's key (``upstream.api_key``, and no ``upstream_key`` of the tenant's own) every
tenant would share one provider account: its files, stored completions, batches and responses.
So only stateless routes (`STATELESS`) pass through on it, plus those ``server.passthrough_routes``
lists; any other gets 403 before anything is sent upstream (`passthrough_allowed`). A client's
own key, or its tenant's, reaches only that client's account, and every route passes.

An upstream failure before the response started is an error status (middleware); after, an
event stream ends with an error event, and any other body is cut off by closing the
connection, so the client sees a truncated body instead of waiting for the rest.

The path is forwarded as the client encoded it, below the upstream's base URL and never above
it: a dot segment (``..``, ``%2e%2e``) or an encoded separator (``%2f``, ``%5c``) in any segment,
however many times encoded, is refused with 400 before anything is sent upstream (the HTTP
client would resolve ``/v1/../x`` to ``/x``, and some servers decode ``%2f`` into a separator).
"""

from __future__ import annotations

import fnmatch
import time
from urllib.parse import unquote

from aiohttp import web

from gateway.http.body import StreamedBody
from gateway.http.errors import BadRequest, Forbidden, GatewayError, UpstreamTimeout
from gateway.http.sse import end_with_error
from gateway.http.upstream import response_headers
from gateway.http.gate import tenant_of
from gateway.keys import METRICS, OWNED, REQUEST_ID, SETTINGS, UPSTREAM, UPSTREAM_KEY

ROUTE = "passthrough"

# (method, path glob) of the routes that read or write nothing on the provider's account.
STATELESS = (
    ("GET", "/v1/models"), ("GET", "/v1/models/*"), ("POST", "/v1/embeddings"), ("POST", "/v1/moderations"),
    ("POST", "/v1/messages/count_tokens"),
)


def passthrough_allowed(method: str, path: str, settings) -> bool:
    """May `method` `path` (decoded) go upstream with the operator's key? Stateless routes, and
    those ``server.passthrough_routes`` lists ('METHOD /v1/glob' or '/v1/glob' for any method)."""
    method = "GET" if method == "HEAD" else method.upper()
    rules = [*STATELESS, *(_rule(entry) for entry in settings.server.passthrough_routes)]
    return any(m in ("*", method) and fnmatch.fnmatchcase(path, glob) for m, glob in rules)


def refused(request: web.Request) -> Forbidden | None:
    """The 403 for a route that would reach the operator's shared account, else None."""
    if (request.app[UPSTREAM].uses_operator_key(request.get(UPSTREAM_KEY, "")) and not request.get(OWNED, False)
            and not passthrough_allowed(request.method, request.path, request.app[SETTINGS])):
        return Forbidden(
            f"{request.method} {request.path} is not available through this gateway: it would use the operator's "
            "provider account, shared by every tenant (server.passthrough_routes lists the routes allowed).",
        )
    return None


def _rule(entry: str) -> tuple[str, str]:
    parts = entry.split(None, 1)
    return ("*", parts[0]) if len(parts) == 1 else (parts[0].upper(), parts[1].strip())


async def passthrough(request: web.Request) -> web.StreamResponse:
    tenant_of(request)  # the gate resolved the tenant (a 401 for a missing/unknown client key)
    raw_path = safe_raw_path(request.rel_url.raw_path)
    upstream = request.app[UPSTREAM]
    tenant_key = request.get(UPSTREAM_KEY, "")
    refusal = refused(request)
    if refusal is not None:
        raise refusal
    metrics = request.app[METRICS]
    started = time.perf_counter()
    waited = 0.0
    headers = upstream.request_headers(request.headers, path=request.path, tenant_key=tenant_key)
    body = None
    if request.body_exists:
        compressed = "Content-Encoding" in request.headers
        limits = request.body_limits() if compressed else None  # a GatewayRequest (gateway.http.edge)
        body = StreamedBody(request.content, request.app[SETTINGS].server.body_read_timeout_s, limits)
        if request.content_length is not None and "Content-Encoding" not in request.headers:
            headers["Content-Length"] = str(request.content_length)  # decoded bodies go chunked
    status = 502
    response: web.StreamResponse | None = None
    try:
        t0 = time.perf_counter()
        async with upstream.request(
            upstream.raw, request.method, upstream.raw_url(raw_path, request.rel_url.raw_query_string), headers=headers, data=body
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
        if body is not None and body.failure is not None:
            exc = body.failure  # the upload stalled or grew too large: the client's fault, not the upstream's
        status = exc.status
        if response is None or not response.prepared:
            raise exc from None
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


def safe_raw_path(raw_path: str) -> str:
    """`raw_path` (as the client encoded it) if no segment can climb out of /v1, else 400."""
    for segment in raw_path.split("/"):
        decoded = segment
        for _ in range(4):  # %252e%252e is %2e%2e to a server that decodes twice
            if decoded in (".", "..") or "/" in decoded or "\\" in decoded:
                raise BadRequest(
                    "The path may not contain dot segments ('..', '%2e%2e') or encoded separators ('%2f', '%5c').",
                    code="invalid_path",
                )
            if "%" not in decoded:
                break
            decoded = unquote(decoded)
    return raw_path
