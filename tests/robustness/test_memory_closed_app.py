"""A gateway that has been cleaned up is garbage: nothing in the process keeps its stores, recall
index or embedder alive (a process that starts several gateways, like the test suite or a
benchmark, grew by one whole gateway per app before: aiohttp's cache of middleware chains held
every app it had served; gateway/http/edge.py)."""

from __future__ import annotations

import gc
import weakref

import aiohttp

from gateway.app import create_app
from gateway.keys import INDEXER
from gateway.settings import load_settings

from tests.conftest import _serve

BODIES = {
    "/v1/chat/completions": {"model": "fake-32k", "messages": [{"role": "user", "content": "hello"}]},
    "/v1/responses": {"model": "fake-32k", "input": "hello"},
    "/v1/messages": {"model": "fake-32k", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]},
}


async def test_a_cleaned_up_gateway_is_released_with_its_index(upstream, tmp_path):
    settings = load_settings(None, upstream={"base_url": upstream.base_url}, store={"path": str(tmp_path / "data")})
    app = create_app(settings)
    runner, port = await _serve(app)
    async with aiohttp.ClientSession(headers={"X-Session-Id": "closed-app", "anthropic-version": "2023-06-01"}) as http:
        for path, body in BODIES.items():  # a route of each format builds its middleware chain
            async with http.post(f"http://127.0.0.1:{port}{path}", json=body) as r:
                assert r.status == 200, (path, await r.text())
                assert (await r.json())["model"] == "fake-32k"
    assert set(BODIES) <= {q["path"] for q in upstream.received}  # each went through to the upstream
    index = await app[INDEXER].opened()  # the recall index and its embedder: the heavy part
    refs = [weakref.ref(app), weakref.ref(index)]
    await runner.cleanup()
    del app, runner, index
    gc.collect()
    assert [r() for r in refs] == [None, None]
