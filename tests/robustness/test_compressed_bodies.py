"""Compressed request bodies cannot make the gateway decode without bound: a response sent
before a compressed body was read closes the connection (aiohttp would otherwise go on reading
and decoding the rest on the event loop), and a body is decoded only within ``max_body_mb`` and
``max_decompression_ratio``."""

from __future__ import annotations

import asyncio
import zlib

import aiohttp
import orjson


def gzip_of(data_parts, total_mb: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    return b"".join(z.compress(block) for _ in range(total_mb)) + z.flush()


def gzip_json(value) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return z.compress(orjson.dumps(value)) + z.flush()


async def test_unauthenticated_compressed_body_closes_the_connection_unread(start_gateway, upstream):
    gw = await start_gateway(upstream={"api_key": "sk-operator"}, tenants={"alice": "pk-alice"})
    port = int(gw.root.rsplit(":", 1)[1])
    bomb = gzip_of(None, 64)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n").encode()
    writer.write(head + bomb[:4096])  # the rest never comes: nothing must wait for it
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)  # to EOF: the gateway closed the connection
    writer.close()
    assert raw.startswith(b"HTTP/1.1 401")
    assert b"Connection: close" in raw
    assert upstream.received == []


async def test_compressed_chat_body_over_the_ratio_is_413(start_gateway, upstream):
    gw = await start_gateway()
    bomb = gzip_of(None, 16)  # 16 MiB of zeros in ~16 KB: under max_body_mb, far over the ratio
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", data=bomb,
                          headers={"Content-Encoding": "gzip", "Content-Type": "application/json", "X-Session-Id": "z"}) as r:
            assert r.status == 413
            error = (await r.json())["error"]
    assert error["code"] == "request_too_large" and "max_decompression_ratio" in error["message"]
    assert upstream.received == []


async def test_compressed_chat_body_within_limits_is_read(start_gateway, upstream):
    gw = await start_gateway()
    body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hello there " * 2000}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", data=gzip_json(body),
                          headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as r:
            assert r.status == 200
    assert upstream.chat_requests()[-1]["json"]["messages"] == body["messages"]


async def test_compressed_passthrough_upload_is_bounded_decoded(start_gateway, upstream):
    gw = await start_gateway(server={"max_body_mb": 8})
    bomb = gzip_of(None, 64)
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/files", data=bomb, headers={"Content-Encoding": "gzip"}) as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "request_too_large"
    for received in upstream.received:  # anything the upstream got was cut short, never 64 MiB
        assert received.get("body_len", 0) < 64 << 20
