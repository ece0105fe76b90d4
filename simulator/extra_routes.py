"""The puppet's other routes: embeddings (hash-seeded unit vectors), the echo endpoints under
/v1/echo that pass-through tests read back, and a provider's 404 for any other /v1 route."""

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
from simulator.errors import SIMULATED_NOTICE, PuppetError, invalid
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


async def unknown_route(request: web.Request) -> web.Response:
    """A route the simulator does not serve: 404 in the error envelope, worded like the provider's
    ("Invalid URL (POST /v1/responses)"), so a client fails with a message that says so."""
    await _echo_payload(request)  # recorded like any request, the body read to its end
    raise PuppetError(404, f"Invalid URL ({request.method} {request.path}); the {SIMULATED_NOTICE} "
                      "serves /v1/chat/completions, /v1/models, /v1/embeddings and /v1/echo/*.")


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

