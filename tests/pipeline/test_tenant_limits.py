"""Per-tenant limits (gateway/pipeline/limits.py): n, each format's output-token field and the
request rate, with defaults and [tenants.NAME] overrides; /metrics closed when tenants exist."""

from __future__ import annotations

import logging

import aiohttp
import pytest

A, B = "pk-limits-a", "pk-limits-b"
TENANTS = {"alice": {"key": A, "max_output_tokens": 1000, "requests_per_minute": 3}, "bob": B}
MSG = [{"role": "user", "content": "hi"}]
ROUTES = {
    "chat": ("/v1/chat/completions", {"model": "fake-32k", "messages": MSG}, "max_tokens"),
    "chat-completion-tokens": ("/v1/chat/completions", {"model": "fake-32k", "messages": MSG}, "max_completion_tokens"),
    "responses": ("/v1/responses", {"model": "fake-32k", "input": "hi"}, "max_output_tokens"),
    "messages": ("/v1/messages", {"model": "fake-32k", "messages": MSG}, "max_tokens"),
}


async def post(gw, path: str, body: dict, key: str) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.root + path, json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)


def envelope(path: str, body: dict) -> str:
    """The error's message, checking it is in the route's own envelope."""
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"]


@pytest.mark.parametrize("route", ROUTES)
async def test_output_tokens_over_the_cap_are_a_400_and_nothing_goes_upstream(start_gateway, upstream, route):
    gw = await start_gateway(tenants=TENANTS)
    path, body, field = ROUTES[route]
    before = len(upstream.received)
    status, answer, _ = await post(gw, path, {**body, field: 10**9}, B)  # bob: the default cap
    assert status == 400 and field in envelope(path, answer)
    status, answer, _ = await post(gw, path, {**body, field: 2000}, A)  # alice: her own, lower cap
    assert status == 400 and "1000" in envelope(path, answer)
    assert len(upstream.received) == before
    status, _, _ = await post(gw, path, {**body, field: 2000}, B)
    assert status == 200


async def test_n_over_the_cap_is_a_400(start_gateway, upstream):
    gw = await start_gateway(tenants=TENANTS)
    before = len(upstream.received)
    status, answer, _ = await post(gw, "/v1/chat/completions", {"model": "fake-32k", "messages": MSG, "n": 100_000}, B)
    assert status == 400 and answer["error"]["param"] == "n"
    assert len(upstream.received) == before
    status, answer, _ = await post(gw, "/v1/chat/completions", {"model": "fake-32k", "messages": MSG, "n": 2}, B)
    assert status == 200 and len(answer["choices"]) == 2


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
async def test_a_tenant_over_its_rate_gets_429_with_retry_after(start_gateway, route):
    gw = await start_gateway(tenants=TENANTS)
    path, body, field = ROUTES[route]
    body = {**body, field: 16}
    statuses = [(await post(gw, path, body, A))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    status, answer, headers = await post(gw, path, body, A)
    assert status == 429 and "requests per minute" in envelope(path, answer)
    assert int(headers["Retry-After"]) >= 1
    assert (await post(gw, path, body, B))[0] == 200  # another tenant's bucket is its own


async def get_metrics(gw, headers=None) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + "/metrics", headers=headers or {}) as r:
            return r.status


async def test_metrics_need_a_token_when_tenants_are_configured(start_gateway, caplog):
    closed = await start_gateway(tenants=TENANTS)
    assert await get_metrics(closed) == 401
    guarded = await start_gateway(tenants=TENANTS, server={"metrics_token": "mt"})
    assert await get_metrics(guarded, {"Authorization": "Bearer mt"}) == 200
    with caplog.at_level(logging.INFO, logger="palimpsest"):
        opened = await start_gateway(tenants=TENANTS, server={"metrics_open": True})
        assert await get_metrics(opened) == 200
    said = [r for r in caplog.records if "/metrics is open" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
