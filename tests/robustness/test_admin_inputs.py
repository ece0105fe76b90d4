"""Hostile input to the admin API (with a valid token): every combination of odd query values
and bodies on the session routes is a 2xx or an OpenAI-envelope 4xx, never a 500."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import orjson

QUERIES = ["", "?head=zzz", "?head=", "?checkpoint=cp_nope", "?max_tokens=-1", "?max_tokens=99999999999999999999",
           "?max_tokens=" + "9" * 5000, "?max_tokens=1e3", "?model=%00", "?limit=0", "?limit=99999999999999999999999", "?tenant=%ff"]
BODIES = [None, b"[]", b"{}", b'{"tools": [1, 2]}', b'{"tools": [{"function": 5}]}', b'{"system": [{"role": "system", "content": 5}]}',
          b'{"system": "s", "max_tokens": 0}', b'{"model": ""}', b'{"max_tokens": 1e400}', b"\xff", b"[" * 2000]


async def test_admin_session_routes_never_500(start_gateway):
    gw = await start_gateway(server={"admin_token": "adm"})
    root = gw.base_url.removesuffix("/v1")
    auth = {"Authorization": "Bearer adm", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hello admin"}]}
        async with http.post(f"{gw.base_url}/chat/completions", json=body, headers={"X-Session-Id": "adm"}) as r:
            assert r.status == 200
        async with http.get(f"{root}/admin/sessions", headers=auth) as r:
            key = (await r.json())["data"][0]["key"]
        failures = []
        paths = [f"/admin/sessions/{key}", f"/admin/sessions/{key}/view", "/admin/sessions/a/b", "/admin/sessions"]
        for path, query, payload in itertools.product(paths, QUERIES, BODIES):
            method = "GET" if payload is None else "POST"
            async with http.request(method, root + path + query, data=payload, headers=auth) as r:
                text = await r.read()
                if r.status >= 500 or (r.status >= 400 and "error" not in orjson.loads(text)):
                    failures.append((method, path.replace(key, "KEY"), query[:40], (payload or b"")[:40], r.status, text[:120]))
    assert not failures, failures[:5]


async def test_admin_token_that_is_not_utf8_is_a_401(start_gateway):
    gw = await start_gateway(server={"admin_token": "adm"})
    host, port = gw.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /admin/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
    await writer.drain()
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.1 401"), response[:200]
    assert b'"error"' in response
