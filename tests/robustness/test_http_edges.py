"""Hostile input at the HTTP edge: every answer a 4xx in the OpenAI envelope, never a hang,
and nothing sent upstream that the client was refused for.

- Requests aiohttp's parser rejects before any handler runs (headers or a request line over
  8190 bytes, a request line that is not HTTP, a Content-Encoding it cannot decode) get the
  envelope with 431 / 400 / 415, not aiohttp's plain text.
- A body that stops or trickles gets 408 after ``server.body_read_timeout_s`` (chat completions
  and pass-through uploads); a request head that never ends is closed after
  ``server.keepalive_timeout_s``.
- A pass-through path with dot segments or encoded separators never reaches the upstream.

Malformed bytes go over raw sockets (no client library would send them); well-formed requests
use the official openai SDK or aiohttp. The upstream is a real aiohttp server on port 0 that
records every request line it gets.
"""

from __future__ import annotations

import asyncio
import gzip

import openai
import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.compression_utils import HAS_BROTLI

CLIENT_WAIT_S = 10.0  # far above the gateway's tiny timeouts below: "gave up" vs "hung" cannot be confused
SEEN: web.AppKey[list[dict]] = web.AppKey("edge_seen", list)


@pytest.fixture
async def recorder():
    """An upstream that records method, raw path and body of every request, and answers 200."""

    async def record(request: web.Request) -> web.Response:
        entry = {"method": request.method, "raw_path": request.raw_path, "body": None}
        request.app[SEEN].append(entry)
        entry["body"] = await request.read()
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app[SEEN] = []
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield app, f"http://127.0.0.1:{runner.addresses[0][1]}/base/v1"
    await runner.cleanup()


@pytest.fixture
async def edge_gw(start_gateway, recorder):
    """A gateway in front of the recorder (pass-through), with tiny body and head timeouts."""
    app, url = recorder
    gw = await start_gateway(upstream={"base_url": url}, server={"body_read_timeout_s": 0.5, "keepalive_timeout_s": 0.5})
    return gw, app[SEEN]


def _port(gw) -> int:
    return int(gw.root.rsplit(":", 1)[1])


async def _exchange(port: int, data: bytes, *, then: list[tuple[float, bytes]] = ()) -> bytes:
    """Send `data` (and each later piece after its delay) on a fresh connection; the one
    response the gateway sent back (b"" if it closed the connection without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        for delay, piece in then:
            await asyncio.sleep(delay)
            if writer.is_closing() or reader.at_eof():
                break
            try:
                writer.write(piece)
                await writer.drain()
            except ConnectionError:
                break
        return await asyncio.wait_for(_response(reader), CLIENT_WAIT_S)
    finally:
        writer.close()


async def _response(reader: asyncio.StreamReader) -> bytes:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    body = await (reader.readexactly(length) if length is not None else reader.read())
    return head + body


def _envelope(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    assert headers["content-type"].startswith("application/json"), raw[:300]
    error = orjson.loads(body[:length])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return status, headers, error


def _head(path: str = "/v1/models", method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: gw\r\n{extra}Connection: close\r\n\r\n".encode()


# --- 1. rejected by aiohttp's parser, answered in the envelope ---


async def test_header_over_8190_bytes_is_a_431_envelope_via_the_sdk(edge_gw):
    gw, seen = edge_gw
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0,
                                default_headers={"X-Big": "a" * 9000})
    with pytest.raises(openai.APIStatusError) as caught:
        await client.models.list()
    assert caught.value.status_code == 431
    assert caught.value.body["code"] == "request_header_fields_too_large"
    assert "8190" in caught.value.body["message"]
    assert seen == []


@pytest.mark.parametrize("request_bytes, status, code", [
    (_head(extra="X-Big: " + "b" * 9000 + "\r\n"), 431, "request_header_fields_too_large"),
    (_head(path="/v1/" + "c" * 9000), 431, "request_header_fields_too_large"),
    (_head(extra="".join(f"X-H{i}: v\r\n" for i in range(200))), 431, "request_header_fields_too_large"),
    (b"GARBAGE\r\n\r\n", 400, "malformed_request"),
    (b"G@T /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n", 400, "malformed_request"),
    (_head(extra="Bad Header Name: x\r\n"), 400, "malformed_request"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "malformed_request"),  # TLS on the plain port
], ids=["header", "request-line", "too-many-headers", "garbage", "bad-method", "bad-header-name", "tls"])
async def test_requests_the_parser_rejects_get_the_envelope(edge_gw, request_bytes, status, code):
    gw, seen = edge_gw
    got_status, _, error = _envelope(await _exchange(_port(gw), request_bytes))
    assert (got_status, error["code"], error["type"]) == (status, code, "invalid_request_error")
    assert "b'" not in error["message"]  # the client's bytes (maybe a credential) are not echoed
    assert seen == []


@pytest.mark.skipif(HAS_BROTLI, reason="with Brotli installed aiohttp decodes br")
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_brotli_body_without_brotli_is_a_415_envelope(edge_gw, path):
    gw, seen = edge_gw
    async with ClientSession() as http:
        async with http.post(gw.root + path, data=b"\x1b\x00\x00", headers={
                "Content-Encoding": "br", "Content-Type": "application/json"}) as resp:
            body = await resp.json()
    assert resp.status == 415
    assert body["error"]["code"] == "unsupported_content_encoding"
    assert seen == []


@pytest.mark.parametrize("encoding", ["compress", "x-custom", "gzip, br", "gzip, gzip"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_content_encoding_aiohttp_does_not_decode_is_a_415_envelope(edge_gw, path, encoding):
    """aiohttp hands these over as raw bytes: parsed as JSON or forwarded without the header
    that explains them, they would be misread; the client is told instead."""
    gw, seen = edge_gw
    async with ClientSession() as http:
        async with http.post(gw.root + path, data=gzip.compress(b'{"model": "m"}'), headers={
                "Content-Encoding": encoding, "Content-Type": "application/json"}) as resp:
            body = await resp.json()
    assert resp.status == 415
    assert body["error"] == {"message": body["error"]["message"], "type": "invalid_request_error",
                             "param": "Content-Encoding", "code": "unsupported_content_encoding"}
    assert seen == []


async def test_gzip_upload_still_passes_through_decoded(edge_gw):
    gw, seen = edge_gw
    async with ClientSession() as http:
        async with http.post(gw.base_url + "/embeddings", data=gzip.compress(b'{"input": "x"}'),
                             headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as resp:
            assert resp.status == 200
    assert [(s["method"], s["raw_path"], s["body"]) for s in seen] == [("POST", "/base/v1/embeddings", b'{"input": "x"}')]


# --- 2. a body that does not come, a head that does not end ---


_CHAT = b'{"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}'


def _post_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_body_that_stops_is_a_408_envelope_and_the_connection_closes(edge_gw, upstream, path):
    gw, seen = edge_gw
    raw = await _exchange(_port(gw), _post_head(path, len(_CHAT)) + _CHAT[:10])
    status, headers, error = _envelope(raw)
    assert (status, error["code"]) == (408, "request_timeout")
    assert headers.get("connection", "").lower() == "close"
    # Nothing complete reached an upstream: the chat upstream (puppet) got no call, and the
    # pass-through recorder at most a request whose body never finished.
    assert upstream.chat_requests() == []
    assert all(s["body"] is None for s in seen)


async def test_a_body_that_came_whole_is_read_without_a_timer_and_a_late_one_with_it(edge_gw, monkeypatch):
    """A body that arrived with its head cannot be slow: it is read without arming the body
    timeout; one that is still on its way is read under it."""
    from gateway.http import edge

    armed: list[float] = []

    def timeout(delay):
        armed.append(delay)
        return asyncio.timeout(delay)

    monkeypatch.setattr(edge, "asyncio", type("asyncio", (), {"timeout": staticmethod(timeout)}))
    gw, seen = edge_gw
    whole = await _exchange(_port(gw), _post_head("/v1/chat/completions", len(_CHAT)) + _CHAT)
    assert whole.startswith(b"HTTP/1.1 200") and armed == []
    late = await _exchange(_port(gw), _post_head("/v1/chat/completions", len(_CHAT)) + _CHAT[:10], then=[(0.05, _CHAT[10:])])
    assert late.startswith(b"HTTP/1.1 200") and armed == [0.5]
    assert [s["body"] for s in seen] == [_CHAT, _CHAT]  # the upstream got both bodies whole


async def test_chat_body_that_trickles_is_a_408_envelope(edge_gw, upstream):
    """Each byte well within the timeout of the one before, the whole far beyond it."""
    gw, _ = edge_gw
    trickle = [(0.1, _CHAT[i:i + 1]) for i in range(10, 25)]
    raw = await _exchange(_port(gw), _post_head("/v1/chat/completions", len(_CHAT)) + _CHAT[:10], then=trickle)
    status, _, error = _envelope(raw)
    assert (status, error["code"]) == (408, "request_timeout")
    assert upstream.chat_requests() == []


async def test_upload_that_is_slow_but_steady_passes_through(edge_gw):
    """Pass-through uploads are streamed: the timeout bounds the silence between chunks only."""
    gw, seen = edge_gw
    body = b'{"input": "' + b"x" * 30 + b'"}'
    pieces = [(0.1, body[i:i + 4]) for i in range(8, len(body), 4)]  # ~1 s in all, 0.1 s apart
    raw = await _exchange(_port(gw), _post_head("/v1/embeddings", len(body)).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body[:8],
                          then=pieces)
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert [s["body"] for s in seen] == [body]


async def test_request_head_that_never_ends_is_closed(edge_gw):
    gw, seen = edge_gw
    raw = await _exchange(_port(gw), b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
    assert raw == b""  # closed, no answer owed: no request was ever made
    assert seen == []


# --- 3. pass-through paths stay below the upstream's /v1 ---


@pytest.mark.parametrize("path", [
    "/v1/%2e%2e/admin", "/v1/%2E%2e/%2e%2E/x", "/v1/.%2e/x", "/v1/models/../../etc", "/v1/./models",
    "/v1/models%2f..%2f..%2fx", "/v1/..%2f..%2fx", "/v1/..%5c..%5cx", "/v1/..\\..\\x",
    "/v1/files/%252e%252e/x", "/v1/files/%25252e%25252e/x",
])
async def test_dot_segments_and_encoded_separators_never_reach_the_upstream(edge_gw, path):
    gw, seen = edge_gw
    status, _, error = _envelope(await _exchange(_port(gw), _head(path)))
    assert (status, error["code"]) == (400, "invalid_path")
    assert seen == []


async def test_sdk_file_id_that_climbs_is_refused(edge_gw):
    gw, seen = edge_gw
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.files.retrieve("../../admin")
    assert caught.value.body["code"] == "invalid_path"
    assert seen == []


async def test_path_and_query_reach_the_upstream_as_the_client_encoded_them(edge_gw):
    gw, seen = edge_gw
    raw = await _exchange(_port(gw), _head("/v1/files/a%20b%3F%23c/content?q=a%26b&after=x%2Fy"))
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert [s["raw_path"] for s in seen] == ["/base/v1/files/a%20b%3F%23c/content?q=a%26b&after=x%2Fy"]


# --- what the logs keep of a rejected request ---


async def test_parser_rejection_logs_no_client_bytes(edge_gw, caplog):
    """A header the parser refuses may carry a credential: the log names the rejection, not the bytes."""
    gw, _ = edge_gw
    secret = "sk-live-0123456789abcdef"
    for request_bytes in (_head(extra=f"Authorization: Bearer {secret}\x01\r\n"),
                          _head(extra=f"X-Key: {secret}" + "z" * 9000 + "\r\n")):
        status, _, _ = _envelope(await _exchange(_port(gw), request_bytes))
        assert status in (400, 431)
    assert secret not in caplog.text
    assert "malformed request" in caplog.text
