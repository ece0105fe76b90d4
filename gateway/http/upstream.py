"""The upstream provider: one pooled HTTP client, header hygiene, error mapping, timeouts.

Two client sessions share the pool settings: ``raw`` leaves bodies as they came (so compressed
pass-through responses are relayed byte for byte with their Content-Encoding), ``api`` decodes
them (the gateway reads chat completions to record answers and resolve recall calls).

Three timeouts, because a provider fails in three different ways: it cannot be reached
(``connect``), it accepts the request but never starts answering (``first_byte``: its response
headers, then the first chunk of its body), or it starts and then stalls (``idle``: the longest
silence between two chunks). Each ends in ``UpstreamTimeout`` (504); once the client's stream
has started, the caller tells it inside the stream instead (``gateway.http.sse.end_with_error``).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gateway.http.errors import UpstreamTimeout, UpstreamUnreachable, speaks_anthropic

# RFC 9110 §7.6.1 hop-by-hop headers, plus the ones the transport recomputes.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)
# The client's account selectors and browser state: meaningless, or worse, on the operator's
# account, so they are dropped whenever the operator's key goes upstream in place of the client's.
OPERATOR_DROPS = frozenset({"openai-organization", "openai-project", "cookie"})
# Every header that can carry a credential; replaced whenever the gateway supplies the key.
CREDENTIALS = ("Authorization", "api-key", "x-api-key")
# The Messages API version the gateway's own calls to an Anthropic upstream name.
ANTHROPIC_VERSION = "2023-06-01"
# Set by aiohttp's server on every response; copying the upstream's as well would duplicate them.
SERVER_SET = frozenset({"server", "date"})


@dataclass(slots=True)
class Timing:
    """Where the time of one request went; overhead = total - upstream."""

    started: float = field(default_factory=time.perf_counter)
    upstream: float = 0.0

    def waiting(self, since: float) -> None:
        self.upstream += time.perf_counter() - since


class BodyReader:
    """Chunks of an upstream body, each within its deadline: the first within the first-byte
    timeout, every later one within the idle timeout. Transport failures and timeouts surface
    as the GatewayErrors of ``Upstream.request`` (the reader is used inside that block)."""

    def __init__(self, response: aiohttp.ClientResponse, first_byte_s: float, idle_s: float) -> None:
        self._response = response
        self._wait = first_byte_s
        self._idle = idle_s

    async def chunk(self) -> bytes:
        """The next chunk, or b"" at the end of the body. What has arrived already is taken
        without arming a timer (a read that does not wait cannot time out): a short answer's
        body usually comes with its head."""
        content = self._response.content
        data = await content.readany() if content.is_eof() else content.read_nowait()
        if data or content.is_eof():
            self._wait = self._idle
            return data
        async with asyncio.timeout(self._wait):
            data = await self._response.content.readany()
        self._wait = self._idle
        return data

    async def chunks(self, timing: Timing | None = None) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive, until it ends: the one loop that reads an upstream
        body (the pass-through's, every relay's, ``read``); `timing` counts the waits as the
        upstream's time."""
        while True:
            t0 = time.perf_counter()
            chunk = await self.chunk()
            if timing is not None:
                timing.waiting(t0)
            if not chunk:
                return
            yield chunk

    async def read(self, timing: Timing | None = None) -> bytes:
        return b"".join([chunk async for chunk in self.chunks(timing)])


class Upstream:
    def __init__(self, base_url: str, api_key: str, *, connect_timeout: float, read_timeout: float, max_connections: int,
                 first_byte_timeout: float | None = None, idle_timeout: float | None = None, format: str = "openai",
                 name: str = "default", summary_model: str = "", embeddings_url: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.format = format  # "openai" or "anthropic": the API the gateway's own calls speak
        self.name = name  # "default" for [upstream], else its [upstreams.NAME]
        self.summary_model = summary_model  # what writes this upstream's summaries ("" = the policy's or the session's)
        self.embeddings_url = (embeddings_url or self.base_url).rstrip("/")
        # What the newest call found, for /readyz: "" (answered), or the kind of failure.
        self.last_failure = ""
        self.first_byte_timeout = min(read_timeout, first_byte_timeout or read_timeout)
        self.idle_timeout = min(read_timeout, idle_timeout or read_timeout)
        # sock_read bounds the wait for the response headers; the body's chunks are timed by
        # BodyReader, so a stall between chunks is told apart from a slow start.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=self.first_byte_timeout)
        self._max_connections = max_connections
        self.raw: aiohttp.ClientSession | None = None
        self.api: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        def session(decompress: bool) -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=300, keepalive_timeout=60)
            return aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=decompress,
                skip_auto_headers=("User-Agent", "Content-Type"), cookie_jar=aiohttp.DummyCookieJar(),
            )

        self.raw = session(False)
        self.api = session(True)

    async def close(self) -> None:
        for s in (self.raw, self.api):
            if s is not None:
                await s.close()

    def url(self, path: str, query_string: str = "") -> str:
        """Map a gateway path (/v1/...) onto the upstream base URL (which ends in /v1 or not)."""
        tail = path[3:] if path.startswith("/v1/") or path == "/v1" else path
        url = self.base_url + tail
        return f"{url}?{query_string}" if query_string else url

    def raw_url(self, raw_path: str, raw_query: str = "", base: str = "") -> URL:
        """Map a path as the client encoded it onto the base URL (or `base`), sent on as it is: not
        decoded (a %2F or %25 stays what the client meant) nor re-resolved (the caller refused dot segments)."""
        url = self.url(raw_path, raw_query)
        if base:
            url = base.rstrip("/") + url[len(self.base_url):]
        return URL(url, encoded=True)

    def key_header(self, path: str) -> str:
        """Where the gateway's key goes: ``x-api-key`` on Anthropic's routes and for an
        Anthropic upstream (``upstream.format``), else ``Authorization: Bearer``."""
        anthropic = self.format == "anthropic" or speaks_anthropic(path)
        return "x-api-key" if anthropic else "Authorization"

    def request_headers(self, incoming: CIMultiDictProxy[str], drop: frozenset[str] = frozenset(), *,
                        path: str = "", tenant_key: str = "") -> CIMultiDict[str]:
        """The client's headers for the upstream, with the tenant's own key (`tenant_key`), else
        the operator's, else the client's credential as it came; a key goes in the header the
        route's API reads (`key_header`)."""
        if not tenant_key and self.api_key:
            drop = drop | OPERATOR_DROPS
        out: CIMultiDict[str] = CIMultiDict()
        for name, value in incoming.items():
            lname = name.lower()
            if lname in HOP_BY_HOP or lname in drop or lname == "content-encoding":
                continue  # content-encoding: aiohttp hands the gateway the request body decoded
            out.add(name, value)
        key = tenant_key or self.api_key
        if key:
            for name in CREDENTIALS:
                out.popall(name, None)
            if self.key_header(path) == "x-api-key":
                out["x-api-key"] = key
            else:
                out["Authorization"] = f"Bearer {key}"
        return out

    def uses_operator_key(self, tenant_key: str = "") -> bool:
        return bool(self.api_key) and not tenant_key

    def reader(self, response: aiohttp.ClientResponse) -> BodyReader:
        return BodyReader(response, self.first_byte_timeout, self.idle_timeout)

    def post_chat(self, incoming: CIMultiDictProxy[str], body: bytes, *, drop: frozenset[str], tenant_key: str = ""):
        """Open a chat completion call carrying the client's headers (minus `drop`) and `body`."""
        return self.post("/v1/chat/completions", incoming, body, drop=drop, tenant_key=tenant_key)

    def post(self, path: str, incoming: CIMultiDictProxy[str], body: bytes, *, drop: frozenset[str], tenant_key: str = ""):
        """Open a JSON POST to `path` (/v1/...) carrying the client's headers (minus `drop`)."""
        headers = self.request_headers(incoming, drop=drop, path=path, tenant_key=tenant_key)
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(len(body))
        return self.request(self.api, "POST", self.url(path), headers=headers, data=body)

    @asynccontextmanager
    async def request(self, session: aiohttp.ClientSession | None, method: str, url: str, **kw) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open an upstream request, mapping transport failures to 502/504."""
        assert session is not None, "upstream not started"
        try:
            async with session.request(method, url, allow_redirects=False, **kw) as resp:
                self.last_failure = f"status {resp.status}" if resp.status >= 500 else ""
                yield resp
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            self.last_failure = "timeout"
            raise UpstreamTimeout(f"The upstream did not answer in time ({type(exc).__name__}).") from None
        except aiohttp.ClientConnectorError as exc:
            self.last_failure = "unreachable"
            raise UpstreamUnreachable(f"The upstream could not be reached: {exc.os_error.__class__.__name__}.") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # reset, closed, or the upload failed
            self.last_failure = "connection failed"
            raise UpstreamUnreachable(f"The upstream connection failed: {type(exc).__name__}.") from None

    def state(self) -> dict:
        """What /readyz tells of this upstream (never its key)."""
        return {"format": self.format, "base_url": self.base_url,
                "status": "failing" if self.last_failure else "ok", **({"last_failure": self.last_failure} if self.last_failure else {})}


def response_headers(upstream: CIMultiDictProxy[str], *, decoded: bool) -> CIMultiDict[str]:
    """Upstream response headers safe to relay (multi-valued ones such as Set-Cookie kept)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lname = name.lower()
        if lname in HOP_BY_HOP or lname in SERVER_SET:
            continue
        if decoded and lname == "content-encoding":
            continue
        if lname == "x-request-id":
            # Ours is echoed as x-request-id; the provider's stays available for support tickets.
            out.add("x-upstream-request-id", value)
            continue
        out.add(name, value)
    return out
