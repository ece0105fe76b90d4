"""The request object every connection gets: what happens below the middleware.

Two things aiohttp does before (or beneath) any handler, and that the error middleware cannot
reach on its own:

- **Parser rejections.** aiohttp's HTTP parser refuses some requests itself: a request line or
  header over its size limits (8190 bytes), too many headers, a request line that is not HTTP, a
  Content-Encoding it cannot decode (br without Brotli). Its protocol answers those with a
  plain-text 400 (``RequestHandler.handle_error``) without routing, so no middleware sees them
  (aiohttp issues #3287 and #6463 ask for a hook; there is none as of 3.14). The one place such a
  request still passes through the application is the request factory: aiohttp builds a
  request object for it with the app's factory and prepares the plain-text response against
  that object. `GatewayRequest`'s prepare hook turns that response, and only that one (a request
  no route ever matched), into the envelope of the route the client asked for with a fitting
  status (431, 415, 400): Anthropic's on ``/v1/messages...``, OpenAI's elsewhere
  (``errors.route_format``). aiohttp builds that request object on a placeholder message whose
  path is ``/``, so `GatewayProtocol` keeps the request target of the head its parser refused
  (the last request line in the bytes that failed and the chunk before them); bytes with no
  request line in them (TLS on the plain port, garbage) get OpenAI's.
- **Body deadline.** aiohttp has no server-side body timeout: a client that sends its headers
  and then trickles its body, or stops, would hold the handler as long as it likes. A body read
  whole (``request.read()``, and so ``json()`` and ``text()``) must arrive within
  ``server.body_read_timeout_s`` or the request is a 408 (``gateway.http.body`` does the same for
  streamed pass-through uploads, chunk by chunk).

- **Logs.** aiohttp logs each rejection with a traceback whose message quotes the client's
  bytes (a header that failed to parse may be a credential). The protocol's logger, handed over
  in `handler_args`, is ``palimpsest.http`` with a filter that keeps only the rejection's type.
- **Unread compressed bodies.** A response sent before its compressed request body was read
  closes the connection, instead of aiohttp reading (and decoding) the rest for up to 10 s
  (lingering), and a body read whole is decoded within its size and ratio limits
  (``gateway.http.body``). An uncompressed body costs no decoding, so it still lingers.
- **Unfinished request heads.** A connection that never completes its request head holds no
  handler, only a socket, until aiohttp's keep-alive timer closes it: ``server.keepalive_timeout_s``
  (75 s; aiohttp's default is 3630 s).
- **A closed app is let go.** aiohttp keeps each route's middleware chain in a module-level
  ``lru_cache`` (``web_app._cached_build_middleware``, 1,024 entries) keyed by the handler and
  the app: after the app's cleanup that cache alone kept the whole gateway alive (its stores,
  recall index and embedder model, ~70 MB once recall had run) in any process that starts
  more than one gateway (tests, benchmarks). The app's last cleanup step empties it; the
  chains of apps still serving are rebuilt on their next request.

`install` makes the app's factory build `GatewayRequest`s and its server `GatewayProtocol`s.
This relies on private names of aiohttp (``Application._make_request`` and ``_make_handler``,
``Request._prepare_hook``, called after the headers are computed and before they are written,
``StreamResponse._set_status``, ``Request._read_bytes``, ``Request._protocol`` and its
``_lingering_time`` and ``_messages``, ``web_app._cached_build_middleware`` since 3.11),
stable since 3.0; tests/robustness/test_http_edges.py fails if they change.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from http import HTTPStatus
from typing import Any

from aiohttp import web, web_app
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from gateway.http.body import BodyLimits, read_bounded, too_slow
from gateway.http.errors import route_error_body
from gateway.keys import SETTINGS

# A request line as the parser reads it: a method token, the target, the version.
REQUEST_LINE = re.compile(rb"(?:^|\n)[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32} (\S{1,8190}) HTTP/\d\.\d\r?\n")
KEEP_BYTES = 16_384  # of the chunk before: where a head that arrives in pieces started


class GatewayProtocol(RequestHandler):
    """aiohttp's protocol, keeping the request target of a request head its parser refused
    (`refused_target`): the request object aiohttp then builds carries a placeholder path."""

    __slots__ = ("_before", "refused_target")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._before = b""
        self.refused_target: str | None = None

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        if len(self._messages) > queued and not isinstance(self._messages[-1][0], RawRequestMessage):
            lines = REQUEST_LINE.findall(self._before + data)
            self.refused_target = lines[-1].decode("latin-1") if lines else None
        self._before = data[-KEEP_BYTES:]


class GatewayServer(Server):
    def __call__(self) -> RequestHandler:
        return GatewayProtocol(self, loop=self._loop, **self._kwargs)


class GatewayRequest(web.Request):
    async def read(self) -> bytes:
        if self._read_bytes is not None:
            return self._read_bytes
        if self.content.is_eof():  # the whole body has arrived (a short one comes with its head): no wait, no timer
            self._read_bytes = await read_bounded(self.content, self.body_limits())
            return self._read_bytes
        timeout = self.app[SETTINGS].server.body_read_timeout_s
        try:
            async with asyncio.timeout(timeout):
                self._read_bytes = await read_bounded(self.content, self.body_limits())
                return self._read_bytes
        except TimeoutError:
            raise too_slow(timeout) from None

    def body_limits(self) -> BodyLimits:
        server = self.app[SETTINGS].server
        return BodyLimits(self.content, int(server.max_body_mb * 2**20), server.max_decompression_ratio)

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        if self._match_info is None and isinstance(response, web.Response) and response.status >= 400:
            status, code, message = classify(response.status, response.text or "")
            target = getattr(self._protocol, "refused_target", None) or self.path
            body = route_error_body(target, status, message, "invalid_request_error" if status < 500 else "api_error",
                                    None, code)
            # Called between aiohttp computing the headers and writing them: set them as well.
            response._set_status(status, HTTPStatus(status).phrase)
            response.body = body
            response.headers["Content-Type"] = "application/json"
            response.headers["Content-Length"] = str(len(body))
            return
        if self.body_exists and "Content-Encoding" in self.headers and not self.content.is_eof():
            # aiohttp would go on reading the rest for up to 10 s (lingering), decoding it on the
            # event loop: the connection closes after this response instead, unread.
            response.force_close()
            response.headers["Connection"] = "close"  # the headers were computed before this hook
            self._protocol._lingering_time = 0.0
            self._protocol.close()  # also stops parsing what still arrives
        await super()._prepare_hook(response)


class _Rejections(logging.Filter):
    """A parser rejection becomes one line naming its type: no traceback, no client bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "malformed request rejected: %s", (type(exc).__name__,)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


PROTOCOL_LOG = logging.getLogger("palimpsest.http")
PROTOCOL_LOG.addFilter(_Rejections())


def handler_args(server: Any) -> dict[str, Any]:
    """aiohttp protocol settings for `web.Application(handler_args=...)` (every runner gets them)."""
    return {"keepalive_timeout": server.keepalive_timeout_s, "logger": PROTOCOL_LOG}


def install(app: web.Application) -> None:
    """Have `app` build a `GatewayRequest` for every request, parser rejections included, on a
    `GatewayProtocol` for every connection."""
    app._make_request = functools.partial(app._make_request, _cls=GatewayRequest)  # type: ignore[method-assign]
    make_handler = app._make_handler

    def _make_handler(**kwargs: Any) -> Server:
        server = make_handler(**kwargs)
        return GatewayServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation, loop=server._loop, **server._kwargs)

    app._make_handler = _make_handler  # type: ignore[method-assign]
    app.on_cleanup.append(_forget_middleware_chains)


async def _forget_middleware_chains(app: web.Application) -> None:
    """Drop aiohttp's cached middleware chains, which hold every app they were built for."""
    cached = getattr(web_app, "_cached_build_middleware", None)
    if cached is not None:
        cached.cache_clear()


def classify(status: int, text: str) -> tuple[int, str, str]:
    """(status, code, message) for aiohttp's plain-text rejection `text`.

    The client's own bytes that aiohttp quotes are left out: a header may carry a credential."""
    first = text.split("\n", 1)[0]
    if first.startswith("Got more than"):  # LineTooLong: the request line or one header field
        limit = first.removeprefix("Got more than ").split(" ", 1)[0]
        return 431, "request_header_fields_too_large", (
            f"The request line or a request header is longer than {limit} bytes, the most the gateway accepts."
        )
    if first.startswith("Too many headers"):
        return 431, "request_header_fields_too_large", "The request has more headers than the gateway accepts."
    if first.startswith("Can not decode content-encoding"):
        encoding = first.removeprefix("Can not decode content-encoding: ").split(".", 1)[0]
        if "install" in first:  # an encoding this installation cannot decode at all
            return 415, "unsupported_content_encoding", (
                f"Content-Encoding {encoding} is not supported: send the body uncompressed, gzip or deflate."
            )
        return 400, "invalid_body", f"The request body could not be decoded as its Content-Encoding ({encoding}) says."
    if status >= 500:
        return status, "internal_error", "The gateway failed to handle this request."
    reason = first.split(" b'", 1)[0].split(" bytearray(", 1)[0].split(": b'", 1)[0].rstrip(": ")
    return status, "malformed_request", f"The request is not valid HTTP/1.1 ({reason[:120] or 'unparseable'})."
