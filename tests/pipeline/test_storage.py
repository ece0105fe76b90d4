"""What a refused request leaves behind (nothing), and how much one tenant may store."""

from __future__ import annotations

import aiohttp

from gateway.keys import LEDGER


async def post(gw, key: str, session: str, content: str, model: str = "fake-32k"):
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {key}", "X-Session-Id": session}) as r:
            return r.status, await r.json()


async def test_a_request_refused_before_the_upstream_stores_nothing(gateway, upstream):
    status, body = await post(gateway, "sk-a", "too-big", "word " * 20_000, model="fake-8k")
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert gateway.app[LEDGER].sessions() == [] and upstream.chat_requests() == []
    status, _ = await post(gateway, "sk-a", "too-big", "a short one", model="fake-8k")
    assert status == 200
    (record,) = gateway.app[LEDGER].sessions()
    assert record.events == 2  # the question and its answer: nothing of the refused request


async def test_a_tenant_over_its_storage_quota_gets_429_and_stores_nothing(start_gateway, upstream, tmp_path):
    gw = await start_gateway(tenants={"small": {"key": "pk-small", "max_stored_mb": 0.01}, "big": "pk-big"},
                             store={"max_stored_mb": 1, "path": str(tmp_path / "data")})
    first = await post(gw, "pk-small", "s1", "x" * 12_000)
    assert first[0] == 200, first  # crosses the 10 KiB line: still stored whole
    forwarded = len(upstream.chat_requests())
    status, body = await post(gw, "pk-small", "s2", "one more")
    assert status == 429
    assert body["error"]["type"] == "insufficient_quota" and body["error"]["code"] == "storage_quota_exceeded"
    assert len(upstream.chat_requests()) == forwarded
    assert [r.session_id for r in gw.app[LEDGER].sessions("small")] == ["s1"]
    assert (await post(gw, "pk-big", "s1", "x" * 12_000))[0] == 200  # the default quota is the other tenant's
