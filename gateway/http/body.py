"""Request bodies: in an encoding the gateway can decode, and not trickled forever.

aiohttp decodes gzip and deflate bodies (br and zstd when their packages are installed) and
hands every other Content-Encoding over as raw bytes, which the gateway would then parse as
JSON, or forward without the header that explains them: `body_middleware` answers those 415.

A body read whole gets ``server.body_read_timeout_s`` in all (``gateway.http.edge``); a
pass-through upload is streamed on to the upstream (`StreamedBody`), so there the same figure
bounds the silence between two chunks and a slow but steady upload of a large file still
goes through. Either way a client that stops sending gets 408 and the connection is closed.

A compressed body is decoded a megabyte at a time as it is read (`read_bounded`), never past
the size limit (``server.max_body_mb``, compressed pass-through uploads included) nor past
``server.max_decompression_ratio`` times the bytes that came in, yielding to the event loop
between steps: a 500 KB gzip of 512 MB of zeros is a 413, not half a gigabyte decoded in one
go. A response sent before a compressed body was read closes the connection
(``gateway.http.edge``), so an unauthenticated client's body is never decoded at all.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

from gateway.http.errors import PayloadTooLarge, RequestTimeout, UnsupportedEncoding

# What aiohttp's request parser decodes (http_parser.py); an encoding it knows but cannot decode
# here (br without Brotli) is refused by the parser itself (gateway.http.edge).
_DECODED = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})
# Decoded bytes per step: small enough that one step is a millisecond of the event loop.
STEP = 1 << 20
# Below this much decoded, any ratio is fine (small JSON bodies compress very well).
RATIO_FREE = 4 << 20


class BodyLimits:
    """The decoded size and the decoded-to-received ratio one body may reach (413 past either)."""

    def __init__(self, content: web.StreamReader, max_size: int, max_ratio: float) -> None:
        self._content = content
        self._max_size = max_size
        self._max_ratio = max_ratio
        self.decoded = 0

    def add(self, n: int) -> None:
        self.decoded += n
        if self.decoded > self._max_size:
            raise PayloadTooLarge(f"The request body is larger than {self._max_size / 2**20:g} MiB decoded (server.max_body_mb).")
        received = self._content.total_raw_bytes
        if self.decoded > RATIO_FREE and received and self.decoded > self._max_ratio * received:
            raise PayloadTooLarge(
                f"The request body decodes to more than {self._max_ratio:g} times its compressed size "
                "(server.max_decompression_ratio): send it uncompressed."
            )


async def read_bounded(content: web.StreamReader, limits: BodyLimits) -> bytes:
    """The whole body, decoded a step at a time within `limits`, its chunks joined once (a body
    that came as one chunk is that chunk: a 500 KB body is not copied twice, into a bytearray
    and out of it)."""
    content.set_read_chunk_size(STEP)
    chunks: list = []
    unyielded = 0
    while chunk := await content.readany():
        limits.add(len(chunk))
        chunks.append(chunk)
        unyielded += len(chunk)
        if unyielded >= STEP:  # readany refills from buffered input without yielding: let others run
            unyielded = 0
            await asyncio.sleep(0)
    if len(chunks) == 1 and type(chunks[0]) is bytes:
        return chunks[0]
    return b"".join(chunks)


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
    raises, the upstream request fails, and `failure` tells the handler why (so the answer is
    the client's 408, not an upstream error)."""

    def __init__(self, content: web.StreamReader, idle_s: float, limits: BodyLimits | None = None) -> None:
        self._content = content
        self._idle_s = idle_s
        self._limits = limits  # for a compressed upload: its decoded size and ratio
        self.failure: RequestTimeout | PayloadTooLarge | None = None  # the client's fault, if the upload failed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                async with asyncio.timeout(self._idle_s):
                    chunk = await self._content.readany()
            except TimeoutError:
                self.failure = too_slow(self._idle_s)
                raise self.failure from None
            if not chunk:
                return
            if self._limits is not None:
                try:
                    self._limits.add(len(chunk))
                except PayloadTooLarge as exc:
                    self.failure = exc
                    raise
            yield chunk


def too_slow(timeout: float) -> RequestTimeout:
    return RequestTimeout(f"The request body did not arrive within {timeout:g} s (server.body_read_timeout_s).")
