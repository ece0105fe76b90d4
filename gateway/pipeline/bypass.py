"""Bypass: one request, or every request of a tenant, sent upstream untouched.

``x-palimpsest-bypass: 1`` on a request (any format), or ``[tenants.NAME] bypass = true`` for
everything a tenant sends, makes the gateway forward the client's body as it came: no view, no
summary, no recall tools, no placeholders. The request is still recorded (the ledger syncs its
messages and its answer), so the session's later requests find their history on one branch,
and it gets a receipt saying it was bypassed. ``palimpsest_bypassed_requests_total`` counts
them by route and reason. This is the user's switch, per request or per tenant; the cost
experiment's holdout arm (sessions sent through the ``direct`` profile) is a different thing.
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.errors import BadRequest

BYPASS_HEADER = "x-palimpsest-bypass"
ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})


def bypass_reason(request: web.Request, tenant: str, bypass_tenants: frozenset[str]) -> str | None:
    """Why this request goes untouched: "header", "tenant", or None (it does not). A header
    value that is neither on nor off is a 400: the client must know which it got."""
    value = request.headers.get(BYPASS_HEADER, "").strip().lower()
    if value in ON:
        return "header"
    if value not in OFF:
        raise BadRequest(f"Header '{BYPASS_HEADER}' has value '{value[:40]}'. Use 1 (bypass) or 0.", param=BYPASS_HEADER)
    return "tenant" if tenant in bypass_tenants else None
