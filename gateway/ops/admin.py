"""Admin API and inspector UI behind server.admin_token (docs/architecture.md, "Inspection").

    GET  /admin/ui                                 the inspector page (no token: it asks for one)
    GET  /admin/static/{file}                      the page's charting library (uPlot 1.6.32, MIT, vendored)
    GET  /admin/sessions?tenant=&limit=            sessions, newest first
    GET  /admin/receipts/{id}                      one request's receipt (gateway/ops/receipts.py), any tenant's
    GET  /admin/sessions/{tenant}/{hash}           branches, events, checkpoints, per-request tokens
    GET  /admin/sessions/{tenant}/{hash}/view      the exact view the upstream would receive
    POST /admin/sessions/{tenant}/{hash}/view      same, with {"system", "tools", "model", ...}
    DELETE /admin/sessions/{tenant}/{hash}         delete the session: ledger, checkpoints, recall index

Query parameters of the session routes: ``head`` (an event id: another branch or an earlier
point), ``model``, ``system``, ``max_tokens``, and for the view ``checkpoint`` (pin to what the
model saw when that checkpoint was the newest). The token is the operator's: every tenant is
visible. Credentials are never stored, so none can leak through here.

With an empty admin_token nothing is served: every /admin path answers 404, so a gateway in
default configuration does not even reveal that the inspector exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import orjson
from aiohttp import web

from gateway.http.errors import BadRequest, NotFound
from gateway.http.gate import open_route, operator_route
from gateway.ops.inspection import Inspector, ViewInputs
from gateway.keys import CHECKPOINTS, LEDGER, PIPELINE, RECEIPTS, RESPONSES, SETTINGS, TURNS
from gateway.ops.receipts import receipt_response

INSPECTOR: web.AppKey[Inspector] = web.AppKey("inspector", Inspector)
UI_PAGE = Path(__file__).parent / "static" / "inspector.html"
# The session chart's library, served from the package (the gateway may run offline): uPlot
# 1.6.32 (MIT; its licence beside it), the npm package's built files unchanged.
STATIC = {name: (Path(__file__).parent / "static" / name, kind) for name, kind in (
    ("uPlot.iife.min.js", "text/javascript"), ("uPlot.min.css", "text/css"), ("uPlot.LICENSE", "text/plain"))}
MAX_LIST = 1000
# The page: inline script and style plus the vendored chart library from this origin, API calls
# to this origin only. Session content is rendered as text, and this policy is the second line
# against injected markup.
UI_POLICY = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
             "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def setup_admin(app: web.Application) -> None:
    """Register /admin routes behind the operator's gate; nothing is served while
    server.admin_token is empty."""
    if not app[SETTINGS].server.admin_token.get_secret_value():
        app.router.add_route("*", "/admin", open_route(_off))
        app.router.add_route("*", "/admin/{tail:.*}", open_route(_off))
        return
    app.cleanup_ctx.append(_inspector)
    app.router.add_get("/admin/ui", open_route(ui_page))  # the page shell: it asks for the token
    app.router.add_get("/admin/static/{name}", open_route(static_file))  # the page's script and style files
    app.router.add_get("/admin/sessions", operator_route(list_sessions))
    app.router.add_get("/admin/sessions/{tenant}/{digest}", operator_route(session_detail))
    app.router.add_get("/admin/sessions/{tenant}/{digest}/view", operator_route(session_view))
    app.router.add_post("/admin/sessions/{tenant}/{digest}/view", operator_route(session_view))
    app.router.add_delete("/admin/sessions/{tenant}/{digest}", operator_route(session_delete))
    app.router.add_get("/admin/receipts/{receipt_id}", operator_route(admin_receipt))


async def _off(request: web.Request) -> web.Response:
    raise NotFound(f"Unknown path '{request.path}'.")


async def _inspector(app: web.Application) -> AsyncIterator[None]:
    # Runs after the gateway's own resources (cleanup_ctx order), so the pipeline exists.
    app[INSPECTOR] = Inspector.wrap(ledger=app[LEDGER], checkpoints=app[CHECKPOINTS],
                                    views=app[PIPELINE].views, settings=app[SETTINGS], turns=app[TURNS])
    yield


def _authorize(request: web.Request) -> Inspector:
    """The inspector, for a request the operator's gate let through."""
    return request.app[INSPECTOR]


def _json(data) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _int(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"Query parameter '{name}' has value '{value}'. Not an integer.", param=name) from None
    if number < 0 or number >= 2**63:  # orjson writes 64-bit integers only: larger is a 400, not a failure to render
        raise BadRequest(f"Query parameter '{name}' has value '{value}'. Must be between 0 and 2**63 - 1.", param=name)
    return number


async def _inputs(request: web.Request) -> ViewInputs:
    """Request facts the ledger does not keep: from the query, or a JSON body on POST."""
    q = request.query
    inputs = ViewInputs(model=q.get("model") or None, system=q.get("system") or None, max_tokens=_int(request, "max_tokens"))
    if request.method == "POST" and request.can_read_body:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise BadRequest("The request body must be JSON.") from None
        if not isinstance(body, dict):
            raise BadRequest("The request body must be a JSON object.")
        system, tools = body.get("system"), body.get("tools")
        instructions = isinstance(system, list) and all(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in system)
        if system is not None and not (isinstance(system, str) or instructions):
            raise BadRequest("'system' must be a string or a list of system/developer messages.", param="system")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("'tools' must be an array.", param="tools")
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0):
            raise BadRequest("'max_tokens' must be a non-negative integer.", param="max_tokens")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("'model' must be a string.", param="model")
        inputs.model = model or inputs.model
        inputs.system = system if system is not None else inputs.system
        inputs.tools = tools
        inputs.max_tokens = max_tokens or inputs.max_tokens
    return inputs


def _record(request: web.Request, inspector: Inspector):
    key = f"{request.match_info['tenant']}/{request.match_info['digest']}"
    record = inspector.ledger.session(key)
    if record is None:
        raise NotFound(f"No session '{key}'.")
    return record


async def ui_page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(UI_PAGE, headers={
        "Content-Type": "text/html; charset=utf-8", "Content-Security-Policy": UI_POLICY,
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
    })


async def static_file(request: web.Request) -> web.StreamResponse:
    """The page's vendored library (code, no session data: served without the token, like the page)."""
    found = STATIC.get(request.match_info["name"])
    if found is None:
        raise NotFound(f"Unknown path '{request.path}'.")
    path, kind = found
    return web.FileResponse(path, headers={"Content-Type": f"{kind}; charset=utf-8", "X-Content-Type-Options": "nosniff",
                                           "Cache-Control": "public, max-age=86400"})


async def list_sessions(request: web.Request) -> web.Response:
    inspector = _authorize(request)
    limit = _int(request, "limit")
    sessions = inspector.sessions(request.query.get("tenant") or None, min(limit or MAX_LIST, MAX_LIST))
    return _json({"object": "list", "data": sessions})


async def session_detail(request: web.Request) -> web.Response:
    inspector = _authorize(request)
    record = _record(request, inspector)
    return _json(await inspector.session_detail(record, request.query.get("head") or None, await _inputs(request)))


async def session_view(request: web.Request) -> web.Response:
    inspector = _authorize(request)
    record = _record(request, inspector)
    inputs = await _inputs(request)
    view = await inspector.projected_view(record, request.query.get("head") or None, inputs,
                                          checkpoint=request.query.get("checkpoint") or None)
    return _json(view)


async def session_delete(request: web.Request) -> web.Response:
    """Delete a session everywhere it is kept (store.delete_session)."""
    from gateway.keys import INDEXER
    from store import delete_session

    inspector = _authorize(request)
    record = _record(request, inspector)
    index = await request.app[INDEXER].opened()
    deleted = await delete_session(record.key, ledger=request.app[LEDGER], checkpoints=request.app[CHECKPOINTS], index=index,
                                   responses=request.app[RESPONSES].response_ids)
    request.app[TURNS].delete_session(record.key)
    return _json({"id": record.key, "object": "session.deleted", "deleted": True, **deleted})


async def admin_receipt(request: web.Request) -> web.Response:
    """One request's receipt, whichever tenant's (the operator's token)."""
    _authorize(request)
    receipt_id = request.match_info["receipt_id"]
    return receipt_response(request.app[RECEIPTS].receipt(receipt_id), receipt_id)
