"""What a refused request leaves behind (nothing), and how much one tenant may store."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import aiohttp
import pytest

from gateway.http.errors import StorageQuotaExceeded
from gateway.keys import LEDGER
from gateway.pipeline import quota
from gateway.pipeline.quota import StorageQuota


def on_a_fresh_host(monkeypatch, now: float = 5.0) -> None:
    """The quota's clock as on a host booted `now` seconds ago (time.monotonic() counts from
    boot): below quota.REFRESH_S, where a never-read tenant once looked freshly read."""
    monkeypatch.setattr(quota, "time", SimpleNamespace(monotonic=lambda: now))


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


async def test_a_tenant_over_its_storage_quota_gets_429_and_stores_nothing(start_gateway, upstream, tmp_path,
                                                                          monkeypatch):
    on_a_fresh_host(monkeypatch)
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


class SlowLedger:
    """tenant_bytes that blocks until released (a read in flight), counting its calls."""

    def __init__(self, used: int = 0) -> None:
        self.used, self.calls = used, 0
        self.entered, self.release = threading.Event(), threading.Event()

    def tenant_bytes(self, tenant: str) -> int:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(5)
        return self.used


@pytest.mark.parametrize("now", [5.0, 10_000.0], ids=["fresh-host", "long-up"])
async def test_a_tenant_never_read_is_read_whatever_the_clock_says(monkeypatch, now):
    on_a_fresh_host(monkeypatch, now)
    ledger = SlowLedger(used=200)
    ledger.release.set()
    q = StorageQuota(ledger, 0, {"t": 100 / 2**20})
    with pytest.raises(StorageQuotaExceeded):
        await q.check("t")
    assert ledger.calls == 1


@pytest.mark.parametrize("now", [5.0, 10_000.0], ids=["fresh-host", "long-up"])
async def test_what_is_stored_while_the_usage_is_read_is_counted(monkeypatch, now):
    on_a_fresh_host(monkeypatch, now)
    ledger = SlowLedger(used=0)
    q = StorageQuota(ledger, 0, {"t": 100 / 2**20})
    first = asyncio.create_task(q.check("t"))
    second = asyncio.create_task(q.check("t"))  # the same tenant meanwhile: waits for the same read
    await asyncio.to_thread(ledger.entered.wait, 5)
    q.stored("t", 150)  # a request's sync committed after the read's SELECT
    ledger.release.set()
    for check in (first, second):
        with pytest.raises(StorageQuotaExceeded):
            await check
    assert ledger.calls == 1
    with pytest.raises(StorageQuotaExceeded):
        await q.check("t")  # and it stays counted
