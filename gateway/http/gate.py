"""The one gate: who may reach each route, declared where the route is added.

Every route of the app is added with its handler wrapped in one of three gates, and `check`
refuses to start an app that serves a route without one, so a new route cannot skip it:

- ``tenant_route``: the route reads or writes a tenant's data (chat, Responses and its
  ``/compact``, stored responses and their ``input_items``, Messages and ``count_tokens``, the
  pass-through). Before the handler runs, the tenant is resolved from the credential
  (``Identity.tenant``: a 401 for a missing or unknown client key when keys are required, and
  for the admin token, never a client key) and put on the request; handlers read it with
  `tenant_of`, which fails closed on a request the gate did not see. Which of the gateway's
  objects (a session, a response id, a compaction item) the tenant may then name is each
  route's own check, always against this tenant.
- ``operator_route``: the admin API and the inspector, which see every tenant: the request
  must carry ``server.admin_token``.
- ``open_route``: nothing of any tenant's (health, readiness, ``/metrics`` behind its own
  token, the inspector page shell, the 404 of a disabled admin API).
"""

from __future__ import annotations

import functools
import hmac
from typing import Awaitable, Callable

from aiohttp import web

from gateway.http.errors import Unauthorized
from gateway.pipeline.history_ids import MEMO_SCOPE
from gateway.keys import IDENTITY, SETTINGS, TENANT

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TENANT_DATA, OPERATOR, OPEN = "tenant", "operator", "open"
GATE = "__palimpsest_gate__"  # the attribute naming a wrapped handler's gate


def _mark(handler: Handler, kind: str) -> Handler:
    setattr(handler, GATE, kind)
    return handler


def tenant_route(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def gated(request: web.Request) -> web.StreamResponse:
        request[TENANT] = tenant = request.app[IDENTITY].tenant(request)
        scope = MEMO_SCOPE.set(tenant)  # the parsers' memos are this tenant's (gateway/pipeline/history_ids.py)
        try:
            return await handler(request)
        finally:
            MEMO_SCOPE.reset(scope)

    return _mark(gated, TENANT_DATA)


def operator_route(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def gated(request: web.Request) -> web.StreamResponse:
        expected = request.app[SETTINGS].server.admin_token.get_secret_value().encode()
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        # Undecodable bytes are a 401 too, never an error.
        if not expected or not given or not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected):
            raise Unauthorized("The admin API needs 'Authorization: Bearer <server.admin_token>'.")
        return await handler(request)

    return _mark(gated, OPERATOR)


def open_route(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def gated(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    return _mark(gated, OPEN)


def gate_of(handler) -> str | None:
    return getattr(handler, GATE, None)


def tenant_of(request: web.Request) -> str:
    """The tenant the gate resolved for this request."""
    tenant = request.get(TENANT)
    if tenant is None:
        raise RuntimeError(f"{request.method} {request.path} reached a tenant's data without the tenant gate")
    return tenant


def check(app: web.Application) -> None:
    """Refuse an app serving a route without a gate (raised when the app is created)."""
    ungated = [f"{r.method} {r.resource.canonical if r.resource else '?'}" for r in app.router.routes()
               if gate_of(r.handler) is None]
    if ungated:
        raise RuntimeError(f"routes without a gate (gateway/http/gate.py): {', '.join(ungated)}")
