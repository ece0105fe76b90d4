"""The puppet's other routes: embeddings (hash-seeded unit vectors) and the echo endpoints
that pass-through tests read back."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import math
import struct
import time
from typing import Any

import orjson
from aiohttp import web

from simulator.counting import count_text
from simulator.errors import invalid
from simulator.state import record
from simulator.validation import loads_or_none, parse_json_body

EMBEDDING_DIM = 64
# Bodies above this size are hashed but not kept in RECEIVED, so large uploads stay cheap.
RECORD_BODY_LIMIT = 1 << 20


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def embeddings(request: web.Request) -> web.Response:
    raw = await request.read()
    body = loads_or_none(raw)
    await record(request, raw, body)
    if body is None:
        parse_json_body(raw)
    if not isinstance(body, dict) or "input" not in body or not isinstance(body.get("model"), str):
        raise invalid("'input' and 'model' are required.", param="input")
    inputs = body["input"]
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs
                                   and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise invalid("'input' must be a non-empty string or array.", param="input")
    as_base64 = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for i, item in enumerate(inputs):
        text = item if isinstance(item, str) else json.dumps(item)
        tokens += count_text(text) if isinstance(item, str) else len(item)
        vector = unit_vector(text)
        encoded: Any = (base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode()
                        if as_base64 else vector)
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    return web.json_response({"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                             dumps=dumps)


def unit_vector(text: str) -> list[float]:
    """A deterministic unit vector for a text (hash-seeded; similar texts are NOT close)."""
    raw = b""
    block = text.encode()
    while len(raw) < EMBEDDING_DIM * 4:
        block = hashlib.sha256(block).digest()
        raw += block
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{EMBEDDING_DIM}I", raw[:EMBEDDING_DIM * 4])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


async def _echo_payload(request: web.Request) -> dict[str, Any]:
    digest, length, kept = hashlib.sha256(), 0, bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        digest.update(chunk)
        length += len(chunk)
        if length <= RECORD_BODY_LIMIT:
            kept += chunk
    await record(request, bytes(kept) if length <= RECORD_BODY_LIMIT else b"", None)
    return {"method": request.method, "path": request.path, "query": dict(request.query),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_len": length, "body_sha256": digest.hexdigest()}


async def echo(request: web.Request) -> web.Response:
    return web.json_response(await _echo_payload(request), dumps=dumps)


async def echo_gzip(request: web.Request) -> web.Response:
    payload = gzip.compress(orjson.dumps(await _echo_payload(request)))
    return web.Response(body=payload, headers={"Content-Encoding": "gzip"},
                        content_type="application/json")


async def echo_stream(request: web.Request) -> web.StreamResponse:
    await _echo_payload(request)
    count = int(request.query.get("n", "5"))
    delay = float(request.query.get("delay", "0.05"))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for i in range(count):
        await response.write(orjson.dumps({"line": i, "sent_at": time.time()}) + b"\n")
        await asyncio.sleep(delay)
    await response.write_eof()
    return response

