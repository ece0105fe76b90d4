"""Every other /v1/* route passes through untouched, streamed both ways."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json

import aiohttp
import openai


async def test_models_and_embeddings_via_sdk(gateway, upstream):
    c = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0)
    models = await c.models.list()
    assert "fake-32k" in [m.id for m in models.data]
    emb = await c.embeddings.create(model="e", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 64
    assert upstream.received[-1]["path"] == "/v1/embeddings"
    assert upstream.received[-1]["headers"]["authorization"] == "Bearer sk-x"


async def test_any_method_query_and_body_preserved(gateway, upstream):
    payload = b"x" * 1000
    async with aiohttp.ClientSession() as s:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            async with s.request(method, gateway.base_url + "/echo/files/abc?limit=3&order=desc", data=payload if method != "GET" else None, headers={"X-Custom": "1"}) as r:
                assert r.status == 200
                echo = await r.json()
            assert echo["method"] == method
            assert echo["path"] == "/v1/echo/files/abc"
            assert echo["query"] == {"limit": "3", "order": "desc"}
            assert echo["headers"]["x-custom"] == "1"
            if method != "GET":
                assert echo["body_sha256"] == hashlib.sha256(payload).hexdigest()


async def test_large_upload_streams_through(gateway):
    blob = bytes(range(256)) * (20 * 1024 * 4)  # 20 MiB

    async def chunks():
        for i in range(0, len(blob), 1 << 20):
            yield blob[i : i + (1 << 20)]

    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.base_url + "/echo/files", data=chunks()) as r:
            assert r.status == 200
            echo = await r.json()
    assert echo["body_len"] == len(blob)
    assert echo["body_sha256"] == hashlib.sha256(blob).hexdigest()


async def test_gzip_body_relayed_intact(gateway):
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.get(gateway.base_url + "/echo/gzip", headers={"Accept-Encoding": "gzip"}) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            raw = await r.read()
            assert int(r.headers["Content-Length"]) == len(raw)
    assert json.loads(gzip.decompress(raw))
    # A normal client decodes it transparently.
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.base_url + "/echo/gzip") as r:
            assert await r.json()


async def test_streamed_download_arrives_incrementally(gateway):
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.base_url + "/echo/stream?n=6") as r:
            t0 = loop.time()
            times = []
            async for _ in r.content:
                times.append(loop.time() - t0)
    assert len(times) >= 6
    assert times[0] < times[-1] - 0.1


async def test_upstream_status_and_headers_pass_through(gateway):
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.base_url + "/models/does-not-exist") as r:
            assert r.status == 404
            assert (await r.json())["error"]
        async with s.get(gateway.root + "/healthz") as r:
            assert (await r.json()) == {"status": "ok"}


async def test_metrics_endpoint_reports_requests(gateway):
    c = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0, default_headers={"X-Session-Id": "m"})
    await c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    await c.models.list()
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.root + "/metrics") as r:
            text = await r.text()
    assert 'palimpsest_requests_total{model="gpt-test",route="chat",status="200",upstream="default"} 1.0' in text
    assert 'palimpsest_requests_total{model="none",route="passthrough",status="200",upstream="default"} 1.0' in text
    assert "palimpsest_gateway_overhead_seconds_bucket" in text
    assert "palimpsest_upstream_duration_seconds_count" in text
