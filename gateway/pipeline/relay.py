"""Reading an upstream stream: the one loop every relay and every recall round runs.

``upstream_events`` reads the upstream's body chunk by chunk as it arrives (the time spent
waiting counts as the upstream's), splits it into SSE events and yields each chunk with the
events it completed: parsed JSON objects, or ``DONE`` for Chat Completions' ``data: [DONE]``.
A data line that is not JSON is left out: what the gateway cannot read it does not rewrite, and
the plain relay has already passed the chunk's bytes on.

``relay_stream`` is the one relay loop over it: the plain relay (``Pipeline.relay``: the
upstream's bytes as they came, read on the side by the format's ``StreamWatch``) and every
round of the recall loop (``RecallLoop``: what the format's ``RecallStream`` lets through) write
the client's stream with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from gateway.http.sse import SSEDecoder

DONE = "[DONE]"


async def upstream_events(reader, timing=None) -> AsyncIterator[tuple[bytes, list[Any]]]:
    """(chunk, events) until the upstream's body ends; `timing` (a turn's) counts the waits."""
    decoder = SSEDecoder()
    async for chunk in reader.chunks(timing):
        events: list[Any] = []
        for data in decoder.feed(chunk):
            if data == DONE:
                events.append(DONE)
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
        yield chunk, events


def streamed(up) -> bool:
    """Whether an upstream response is an event stream to relay (else a whole body: an error, or
    a JSON answer)."""
    return up.status == 200 and "text/event-stream" in up.headers.get("Content-Type", "")


async def relay_stream(reader, response: web.StreamResponse, sink, timing=None, *, passthrough: bool = False) -> None:
    """The upstream's stream to the client's `response` until the upstream's body ends. Each
    event goes to `sink` (``feed``, ``done`` for ``[DONE]``): with `passthrough` the client gets
    the upstream's bytes as they came and the sink only reads them (a ``StreamWatch``), else the
    client gets what ``feed`` returns (a ``RecallStream``). What was let through before `sink`
    raises (the provider's error event) is written first."""
    async for chunk, events in upstream_events(reader, timing):
        if passthrough:
            await response.write(chunk)
        out = bytearray()
        try:
            for event in events:
                if event is DONE:
                    sink.done()
                elif told := sink.feed(event):
                    out += told
        finally:
            if out:
                await response.write(bytes(out))
