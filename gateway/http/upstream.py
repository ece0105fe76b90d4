"""The upstream provider: one pooled HTTP client, header hygiene, error mapping.

Two client sessions share the pool settings: ``raw`` leaves bodies as they came (so compressed
pass-through responses are relayed byte for byte with their Content-Encoding), ``api`` decodes
them (the gateway reads chat completions to record answers and resolve recall calls).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.errors import UpstreamTimeout, UpstreamUnreachable

# RFC 9110 §7.6.1 hop-by-hop headers, plus the ones the transport recomputes.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)
# Set by aiohttp's server on every response; copying the upstream's as well would duplicate them.
SERVER_SET = frozenset({"server", "date"})


class Upstream:
    def __init__(self, base_url: str, api_key: str, *, connect_timeout: float, read_timeout: float, max_connections: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout)
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

    def request_headers(self, incoming: CIMultiDictProxy[str], drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
        out: CIMultiDict[str] = CIMultiDict()
        for name, value in incoming.items():
            lname = name.lower()
            if lname in HOP_BY_HOP or lname in drop:
                continue
            out.add(name, value)
        if self.api_key:
            out.popall("Authorization", None)
            out.popall("api-key", None)
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    @asynccontextmanager
    async def request(self, session: aiohttp.ClientSession | None, method: str, url: str, **kw) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open an upstream request, mapping transport failures to 502/504."""
        assert session is not None, "upstream not started"
        try:
            async with session.request(method, url, allow_redirects=False, **kw) as resp:
                yield resp
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"The upstream did not answer in time ({type(exc).__name__}).") from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnreachable(f"The upstream could not be reached: {exc.os_error.__class__.__name__}.") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            raise UpstreamUnreachable(f"The upstream connection failed: {type(exc).__name__}.") from None


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
