"""The operator's provider account is not a shared drive: with ``upstream.api_key`` set, a
tenant's pass-through request reaches only stateless routes (unless listed), carries none of the
client's account selectors or cookies, and a tenant with a key of its own uses that instead.
Any operator credential makes client keys required; the admin token is never a client key."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.http.proxy import passthrough_allowed
from gateway.settings import load_settings

OPERATOR = "sk-operator-secret"
CLIENT_EXTRAS = {"OpenAI-Organization": "org-client", "OpenAI-Project": "proj-client", "Cookie": "session=abc"}


@pytest.fixture
async def guarded(start_gateway):
    return await start_gateway(
        upstream={"api_key": OPERATOR},
        tenants={"alice": "pk-alice", "beta": {"key": "pk-beta", "upstream_key": "sk-beta-own"}},
    )


async def call(gw, method: str, path: str, key: str, json=None, headers=None):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, gw.base_url + path, json=json,
                             headers={"Authorization": f"Bearer {key}", **(headers or {})}) as r:
            return r.status, await r.json()


@pytest.mark.parametrize("method,path", [
    ("GET", "/chat/completions"), ("GET", "/chat/completions/chatcmpl-1"), ("DELETE", "/chat/completions/chatcmpl-1"),
    ("GET", "/responses/resp_1"), ("DELETE", "/responses/resp_1"), ("GET", "/files"), ("DELETE", "/files/file-1"),
    ("POST", "/batches"), ("GET", "/vector_stores"), ("POST", "/files"),
])
async def test_stateful_routes_are_refused_on_the_operator_key(guarded, upstream, method, path):
    status, body = await call(guarded, method, path, "pk-alice", json={} if method == "POST" else None)
    assert status == 403
    assert body["error"]["type"] == "permission_error" and body["error"]["code"] == "route_not_allowed"
    assert OPERATOR not in body["error"]["message"]
    assert upstream.received == []  # nothing reached the operator's account


async def test_stateless_routes_pass_without_the_clients_account_headers(guarded, upstream):
    status, _ = await call(guarded, "GET", "/models", "pk-alice", headers=CLIENT_EXTRAS)
    assert status == 200
    status, _ = await call(guarded, "POST", "/embeddings", "pk-alice", json={"model": "e", "input": "a"}, headers=CLIENT_EXTRAS)
    assert status == 200
    status, _ = await call(guarded, "POST", "/moderations", "pk-alice", json={"input": "a"}, headers=CLIENT_EXTRAS)
    assert status == 404  # passed on: the simulated provider serves no moderations, and says so
    body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}
    status, _ = await call(guarded, "POST", "/chat/completions", "pk-alice", json=body, headers=CLIENT_EXTRAS)
    assert status == 200
    assert [r["path"] for r in upstream.received] == ["/v1/models", "/v1/embeddings", "/v1/moderations", "/v1/chat/completions"]
    for received in upstream.received:
        assert received["headers"]["authorization"] == f"Bearer {OPERATOR}"
        assert not {"openai-organization", "openai-project", "cookie"} & set(received["headers"])


async def test_a_tenants_own_upstream_key_reaches_every_route(guarded, upstream):
    # /v1/echo/* is the simulator's echo of any route: a stateful one on the operator's key.
    status, echo = await call(guarded, "GET", "/echo/files?limit=2", "pk-beta", headers=CLIENT_EXTRAS)
    assert status == 200 and echo["path"] == "/v1/echo/files"
    body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}
    status, _ = await call(guarded, "POST", "/chat/completions", "pk-beta", json=body)
    assert status == 200
    files, chat = upstream.received
    assert files["headers"]["authorization"] == chat["headers"]["authorization"] == "Bearer sk-beta-own"
    assert files["headers"]["openai-organization"] == "org-client"  # the tenant's own account: its selectors stay


async def test_listed_routes_pass_on_the_operator_key(start_gateway, upstream):
    gw = await start_gateway(upstream={"api_key": OPERATOR}, tenants={"alice": "pk-alice"},
                             server={"passthrough_routes": ["GET /v1/echo/files*", "/v1/echo/batches"]})
    assert (await call(gw, "GET", "/echo/files/file-1", "pk-alice"))[0] == 200
    assert (await call(gw, "POST", "/echo/batches", "pk-alice", json={}))[0] == 200
    assert (await call(gw, "DELETE", "/echo/files/file-1", "pk-alice"))[0] == 403
    assert [(r["method"], r["path"]) for r in upstream.received] == [("GET", "/v1/echo/files/file-1"),
                                                                     ("POST", "/v1/echo/batches")]


async def test_without_an_operator_key_the_clients_own_key_reaches_every_route(start_gateway, upstream):
    gw = await start_gateway()
    status, _ = await call(gw, "GET", "/echo/files", "sk-client-own", headers=CLIENT_EXTRAS)
    assert status == 200
    assert upstream.received[-1]["headers"]["authorization"] == "Bearer sk-client-own"
    assert upstream.received[-1]["headers"]["openai-project"] == "proj-client"


def test_passthrough_allowed_reads_the_route_list():
    settings = load_settings(None, server={"passthrough_routes": ["DELETE /v1/files/*"]})
    assert passthrough_allowed("GET", "/v1/models", settings)
    assert passthrough_allowed("HEAD", "/v1/models/gpt-4o", settings)
    assert not passthrough_allowed("DELETE", "/v1/models/ft-1", settings)
    assert not passthrough_allowed("GET", "/v1/files", settings)
    assert passthrough_allowed("DELETE", "/v1/files/file-1", settings)
    assert not passthrough_allowed("POST", "/v1/responses", settings)  # compacted elsewhere, never passed through


@pytest.mark.parametrize("section,setting", [
    ("policy", {"summary_api_key": "sk-summary-operator"}),
    ("recall", {"embeddings_api_key": "sk-embed-operator"}),
])
async def test_any_operator_key_makes_client_keys_required(start_gateway, upstream, section, setting):
    gw = await start_gateway(**{section: setting}, tenants={"alice": "pk-alice"})
    body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", json=body, headers={"X-Session-Id": "s"}) as r:
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "invalid_api_key"
    assert upstream.received == []
    status, _ = await call(gw, "POST", "/chat/completions", "pk-alice", json=body)
    assert status == 200


async def test_a_tenant_upstream_key_alone_makes_client_keys_required(start_gateway, upstream):
    gw = await start_gateway(tenants={"beta": {"key": "pk-beta", "upstream_key": "sk-beta-own"}})
    status, body = await call(gw, "GET", "/files", "sk-anyone")
    assert status == 401 and upstream.received == []


async def test_the_admin_token_is_never_forwarded(start_gateway, upstream):
    gw = await start_gateway(server={"admin_token": "adm-secret-token"})
    for method, path in (("GET", "/x"), ("GET", "/models")):
        status, body = await call(gw, method, path, "adm-secret-token")
        assert status == 401 and "adm-secret" not in body["error"]["message"]
    assert upstream.received == []


async def test_anthropic_x_api_key_names_the_tenant(start_gateway, upstream):
    gw = await start_gateway(upstream={"api_key": OPERATOR}, tenants={"alice": "pk-alice"})
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.base_url + "/models", headers={"x-api-key": "pk-alice"}) as r:
            assert r.status == 200
        async with s.get(gw.base_url + "/models", headers={"x-api-key": "pk-nobody"}) as r:
            assert r.status == 401
    assert len(upstream.received) == 1
    assert upstream.received[0]["headers"]["authorization"] == f"Bearer {OPERATOR}"
    assert "x-api-key" not in upstream.received[0]["headers"]
