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

With several upstreams (``gateway/http/routing.py``) ``GET /v1/models`` is the union of theirs
(`models_union`), ``/v1/models/{id}`` and ``POST /v1/embeddings`` go to the upstream of their
model, and every other route to the default ``[upstream]``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from urllib.parse import unquote

import orjson
from aiohttp import web

from gateway.http.body import StreamedBody
from gateway.http.errors import BadRequest, Forbidden, GatewayError, UpstreamTimeout
from gateway.http.sse import end_with_error
from gateway.http.upstream import ANTHROPIC_VERSION, Timing, response_headers
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


def refused(request: web.Request, upstream=None) -> Forbidden | None:
    """The 403 for a route that would reach the operator's shared account of `upstream` (the
    default one when the route names no model), else None."""
    upstream = upstream or request.app[UPSTREAM].for_model(None)
    if (upstream.uses_operator_key(request.get(UPSTREAM_KEY, "")) and not request.get(OWNED, False)
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
    tenant = tenant_of(request)  # the gate resolved the tenant (a 401 for a missing/unknown client key)
    raw_path = safe_raw_path(request.rel_url.raw_path)
    upstreams = request.app[UPSTREAM]
    if len(upstreams) > 1 and request.method in ("GET", "HEAD") and request.path == "/v1/models":
        return await models_union(request, tenant)
    upstream, read, base = await _target(request, upstreams, tenant)
    tenant_key = request.get(UPSTREAM_KEY, "")
    refusal = refused(request, upstream)
    if refusal is not None:
        raise refusal
    metrics = request.app[METRICS]
    timing = Timing()  # the upstream's share of the request's time
    headers = upstream.request_headers(request.headers, path=request.path, tenant_key=tenant_key)
    body = None
    if read is not None:
        body = read  # read whole to find its model (/v1/embeddings with several upstreams)
    elif request.body_exists:
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
            upstream.raw, request.method, upstream.raw_url(raw_path, request.rel_url.raw_query_string, base), headers=headers, data=body
        ) as up:
            timing.waiting(t0)
            status = up.status
            if status >= 400:
                metrics.upstream_error(status)
            response = web.StreamResponse(status=up.status, reason=up.reason, headers=response_headers(up.headers, decoded=False))
            response.headers["x-request-id"] = request.get(REQUEST_ID, "")
            if up.content_length is not None and request.method != "HEAD":
                response.content_length = up.content_length
            await response.prepare(request)
            async for chunk in upstream.reader(up).chunks(timing):
                await response.write(chunk)
            await response.write_eof()
            return response
    except GatewayError as exc:
        if isinstance(body, StreamedBody) and body.failure is not None:
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
        elapsed = time.perf_counter() - timing.started
        metrics.requests.labels(ROUTE, "none", str(status), upstream.name).inc()
        metrics.request_seconds.labels(ROUTE, "none").observe(elapsed)
        metrics.upstream_seconds.labels(ROUTE, "none", upstream.name).observe(timing.upstream)
        metrics.overhead_seconds.labels(ROUTE).observe(max(0.0, elapsed - timing.upstream))


async def _target(request: web.Request, upstreams, tenant: str):
    """(upstream, body read whole or None, base URL or "") of a pass-through request: a model's
    own routes (``/v1/models/{id}``, ``/v1/embeddings``) go to the upstream of that model
    (embeddings to its ``embeddings_url``), every other route to the default upstream."""
    if len(upstreams) == 1:
        return upstreams.default, None, ""
    if request.method in ("GET", "HEAD") and request.path.startswith("/v1/models/"):
        return upstreams.route(request, tenant, request.path[len("/v1/models/"):]), None, ""
    if request.method == "POST" and request.path == "/v1/embeddings":
        raw = await request.read()
        try:
            model = orjson.loads(raw).get("model")
        except (orjson.JSONDecodeError, AttributeError):
            model = None
        upstream = upstreams.route(request, tenant, model if isinstance(model, str) else None)
        return upstream, raw, upstream.embeddings_url
    return upstreams.route(request, tenant, None), None, ""


async def models_union(request: web.Request, tenant: str) -> web.Response:
    """``GET /v1/models`` with several upstreams: every upstream asked (with the tenant's key for
    it, else its own), the lists merged in the order of the configuration. An entry is kept where
    the gateway routes its id, so every listed model is one a client can use; the first entry
    of an id wins. Upstreams that failed are named in ``x-palimpsest-upstreams-failed``; when all
    failed, the first one's answer is relayed."""
    upstreams, metrics = request.app[UPSTREAM], request.app[METRICS]
    settings = request.app[SETTINGS]
    merged: list[dict] = []
    seen: set[str] = set()
    failed: list[str] = []
    first_error: tuple[int, bytes, str] | None = None

    async def ask(upstream) -> tuple[int, bytes, str]:
        key = upstreams.tenant_key(tenant, upstream)
        headers = upstream.request_headers(request.headers, path="/v1/models", tenant_key=key)
        if upstream.format == "anthropic":
            headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        try:
            async with upstream.request(upstream.api, "GET", upstream.url("/v1/models"), headers=headers) as up:
                return up.status, await upstream.reader(up).read(), up.headers.get("Content-Type", "application/json")
        except GatewayError as exc:
            return exc.status, orjson.dumps({"error": {"message": exc.message, "type": exc.type, "code": exc.code}}), "application/json"

    answers = await asyncio.gather(*(ask(u) for u in upstreams.all()))
    for upstream, (status, payload, content_type) in zip(upstreams.all(), answers):
        data = None
        if status == 200:
            try:
                data = orjson.loads(payload).get("data")
            except (orjson.JSONDecodeError, AttributeError):
                data = None
        if not isinstance(data, list):
            metrics.upstream_error(status)
            failed.append(upstream.name)
            first_error = first_error or (status, payload, content_type)
            continue
        for entry in data:
            model = entry.get("id") if isinstance(entry, dict) else None
            if isinstance(model, str) and model not in seen and settings.upstream_for(model) == upstream.name:
                seen.add(model)
                merged.append(entry)
    headers = {"x-request-id": request.get(REQUEST_ID, "")}
    if failed:
        headers["x-palimpsest-upstreams-failed"] = ", ".join(failed)
    if len(failed) == len(answers) and first_error is not None:
        status, payload, content_type = first_error
        return web.Response(status=status, body=payload, headers={**headers, "Content-Type": content_type})
    return web.json_response({"object": "list", "data": merged}, headers=headers)


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
