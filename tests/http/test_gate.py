"""One gate for every route (gateway/http/gate.py): each route of the app declares whose data it
touches, the app refuses to start with a route that declares nothing, and every route that
reads or writes a tenant's data resolves the tenant before its handler runs."""

from __future__ import annotations

import re

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.http import gate
from gateway.settings import load_settings

ADMIN = "adm-token"
OPEN = {"/healthz", "/readyz", "/metrics", "/admin/ui", "/admin/static/{name}"}  # the page shell and its files


def sample(path: str) -> str:
    """A concrete path for a route's pattern."""
    path = path.replace("{tail:input_items}", "input_items").replace("{tail:.*}", "files")
    return re.sub(r"\{[^}]+\}", "x1", path)


def routes(app: web.Application) -> list[tuple[str, str, str | None]]:
    return [(r.method, r.resource.canonical, gate.gate_of(r.handler)) for r in app.router.routes() if r.method != "HEAD"]


def test_every_route_declares_its_gate(tmp_path):
    for admin in ("", ADMIN):
        settings = load_settings(None, store={"path": str(tmp_path)}, server={"admin_token": admin})
        for method, path, kind in routes(create_app(settings)):
            assert kind in (gate.TENANT_DATA, gate.OPERATOR, gate.OPEN), (method, path)
            if path.startswith("/v1"):
                assert kind == gate.TENANT_DATA, (method, path)
            elif path.startswith("/admin") and admin:
                assert kind == (gate.OPEN if path in OPEN else gate.OPERATOR), (method, path)
            elif kind == gate.OPEN:
                assert path in OPEN or (path.startswith("/admin") and not admin), (method, path)


def test_an_app_with_an_ungated_route_does_not_start(tmp_path):
    app = create_app(load_settings(None, store={"path": str(tmp_path)}))
    app.router.add_get("/v1/new/route", lambda request: web.json_response({}))
    with pytest.raises(RuntimeError, match="without a gate"):
        gate.check(app)


async def test_every_tenant_route_resolves_the_tenant_before_its_handler(start_gateway, upstream):
    gw = await start_gateway(tenants={"alice": "pk-alice"}, server={"client_keys": "required", "admin_token": ADMIN})
    checked = 0
    async with aiohttp.ClientSession() as http:
        for method, path, kind in routes(gw.app):
            url = gw.root + sample(path)
            body = {} if method in ("POST", "*") else None
            if kind == gate.TENANT_DATA:
                for headers in ({}, {"Authorization": "Bearer pk-unknown"}, {"Authorization": f"Bearer {ADMIN}"},
                                {"x-api-key": "pk-unknown"}):
                    async with http.request("POST" if method == "*" else method, url, json=body, headers=headers) as r:
                        assert r.status == 401, (method, path, headers, r.status)
                checked += 1
            elif kind == gate.OPERATOR:
                async with http.request(method, url, json=body, headers={"Authorization": "Bearer pk-alice"}) as r:
                    assert r.status == 401, (method, path)
                checked += 1
    assert checked >= 14  # 9 tenant routes, 5 operator routes
    assert upstream.received == []  # nothing reached the upstream before the gate said no
