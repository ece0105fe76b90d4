"""Errors made at the HTTP edge come in the envelope of the route the client asked for.

aiohttp's parser refuses some requests before any route is matched (a header over 8190 bytes,
more than 128 headers, ``Content-Encoding: br`` without Brotli, Content-Length together with
Transfer-Encoding); the body middleware refuses encodings aiohttp does not decode. Each route
of each format gets its API's envelope for every one of them: OpenAI's
``{"error": {message, type, param, code}}`` on chat and Responses, Anthropic's
``{"type": "error", "error": {type, message}}`` on ``/v1/messages`` and
``/v1/messages/count_tokens``. The bytes go over raw sockets (no client library sends them),
in one piece, with the request head split across two writes, and after a good request on the
same connection.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp.compression_utils import HAS_BROTLI

ROUTES = {"/v1/chat/completions": "openai", "/v1/responses": "openai", "/v1/messages": "anthropic",
          "/v1/messages/count_tokens": "anthropic"}


def head(path: str, extra: str = "", body: bytes = b"", close: bool = True) -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body and "Content-Length" not in extra else ""
    return (f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{extra}{length}"
            f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n").encode() + body


REFUSALS = {
    "header-over-8190": (lambda p: head(p, "X-Big: " + "b" * 9000 + "\r\n"), 431),
    "200-headers": (lambda p: head(p, "".join(f"X-H{i}: v\r\n" for i in range(200))), 431),
    "length-and-chunked": (lambda p: head(p, "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"), 400),
    "compress": (lambda p: head(p, "Content-Encoding: compress\r\n", b"abc"), 415),  # the body middleware's
}
if not HAS_BROTLI:
    REFUSALS["br"] = (lambda p: head(p, "Content-Encoding: br\r\n", b"\x1b\x00\x00"), 415)


async def exchange(port: int, *pieces: bytes) -> list[tuple[int, dict]]:
    """Send each piece on one connection (a short pause between), then read every response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(0.05)  # its own read on the gateway's side: the head arrives in parts
            writer.write(piece)
            await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    out = []
    while raw:
        head_bytes, _, rest = raw.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        out.append((int(lines[0].split(" ")[1]), orjson.loads(rest[:length])))
        raw = rest[length:]
    return out


def assert_envelope(api: str, status: int, data: dict) -> None:
    if api == "anthropic":
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"}, data
        assert data["error"]["type"] == "invalid_request_error" and data["error"]["message"]
    else:
        assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}, data
        assert data["error"]["type"] == "invalid_request_error" and data["error"]["code"]


def port_of(gw) -> int:
    return int(gw.root.rsplit(":", 1)[1])


@pytest.mark.parametrize("refusal", REFUSALS)
@pytest.mark.parametrize("path", ROUTES)
async def test_an_edge_refusal_comes_in_the_routes_envelope(gateway, upstream, path, refusal):
    make, status = REFUSALS[refusal]
    [(got, data)] = await exchange(port_of(gateway), make(path))
    assert got == status
    assert_envelope(ROUTES[path], got, data)
    assert upstream.received == []


@pytest.mark.parametrize("path", ROUTES)
async def test_a_head_in_two_pieces_still_gets_the_routes_envelope(gateway, path):
    whole = REFUSALS["header-over-8190"][0](path)
    [(got, data)] = await exchange(port_of(gateway), whole[:60], whole[60:])
    assert got == 431
    assert_envelope(ROUTES[path], got, data)


@pytest.mark.parametrize("path", ROUTES)
async def test_a_refusal_after_a_good_request_on_the_same_connection(gateway, path):
    """The refused head's own route counts, not the connection's first."""
    other = "/v1/chat/completions" if ROUTES[path] == "anthropic" else "/v1/messages"
    good = head(other, "anthropic-version: 2023-06-01\r\n", orjson.dumps(
        {"model": "fake-32k", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}), close=False)
    answers = await exchange(port_of(gateway), good, REFUSALS["header-over-8190"][0](path))
    assert [status for status, _ in answers] == [200, 431]
    assert_envelope(ROUTES[path], 431, answers[1][1])


def test_one_mapping_from_route_to_format():
    from gateway.http.errors import route_format

    assert [route_format(p) for p in ROUTES] == ["chat", "responses", "messages", "messages"]
    assert route_format("/v1/messages?beta=true") == "messages"
    assert route_format("/v1/messagesx") is None and route_format("/v1/models") is None
