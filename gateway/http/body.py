"""Request bodies: in an encoding the gateway can decode, and not trickled forever.

aiohttp decodes gzip and deflate bodies (br and zstd when their packages are installed) and
hands every other Content-Encoding over as raw bytes, which the gateway would then parse as
JSON, or forward without the header that explains them: `body_middleware` answers those 415.

A body read whole gets ``server.body_read_timeout_s`` in all (``gateway.http.edge``); a
pass-through upload is streamed on to the upstream (`StreamedBody`), so there the same figure
bounds the silence between two chunks and a slow but steady upload of a large file still
goes through. Either way a client that stops sending gets 408 and the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from gateway.http.errors import RequestTimeout, UnsupportedEncoding

# What aiohttp's request parser decodes (http_parser.py); an encoding it knows but cannot decode
# here (br without Brotli) is refused by the parser itself (gateway.http.edge).
_DECODED = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})


@web.middleware
async def body_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    if request.body_exists and request.headers.get("Content-Encoding", "").strip().lower() not in _DECODED:
        encoding = request.headers["Content-Encoding"].strip()[:40]
        raise UnsupportedEncoding(
            f"Content-Encoding '{encoding}' is not supported: send the body uncompressed, gzip or deflate.",
            param="Content-Encoding",
        )
    return await handler(request)


class StreamedBody:
    """A request body relayed chunk by chunk, each chunk within `idle_s` of the one before.

    The upstream client reads it as the upload's data; when the client goes quiet the read
    raises, the upstream request fails, and `timed_out` tells the handler why (so the answer is
    the client's 408, not an upstream error)."""

    def __init__(self, content: web.StreamReader, idle_s: float) -> None:
        self._content = content
        self._idle_s = idle_s
        self.timed_out = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    chunk = await self._content.readany()
            except TimeoutError:
                self.timed_out = True
                raise too_slow(self._idle_s) from None
            if not chunk:
                return
            yield chunk

    def error(self) -> RequestTimeout:
        return too_slow(self._idle_s)


def too_slow(timeout: float) -> RequestTimeout:
    return RequestTimeout(f"The request body did not arrive within {timeout:g} s (server.body_read_timeout_s).")
