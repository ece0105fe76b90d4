"""Reading an upstream stream: the one loop every relay and every recall round runs.

``upstream_events`` reads the upstream's body chunk by chunk as it arrives (the time spent
waiting counts as the upstream's), splits it into SSE events and yields each chunk with the
events it completed: parsed JSON objects, or ``DONE`` for Chat Completions' ``data: [DONE]``.
A data line that is not JSON is left out: what the gateway cannot read it does not rewrite, and
the plain relay has already passed the chunk's bytes on.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.http.sse import SSEDecoder

DONE = "[DONE]"


async def upstream_events(reader, timing=None) -> AsyncIterator[tuple[bytes, list[Any]]]:
    """(chunk, events) until the upstream's body ends; `timing` (a turn's) counts the waits."""
    decoder = SSEDecoder()
    while True:
        t0 = time.perf_counter()
        chunk = await reader.chunk()
        if timing is not None:
            timing.waiting(t0)
        if not chunk:
            return
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
