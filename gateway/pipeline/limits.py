"""Per-tenant limits: what one tenant may ask of the provider account ([limits], [tenants.NAME]).

The gateway relays requests on the operator's key (or a tenant's own upstream key), so a
tenant's request is the operator's bill. Three limits hold before anything is stored or sent:

- ``max_n``: the Chat Completions ``n`` (choices, each billed as an answer of its own);
- ``max_output_tokens``: each format's output-token field (Chat ``max_tokens`` and
  ``max_completion_tokens``, Responses ``max_output_tokens``, Messages ``max_tokens``);
- ``requests_per_minute``: a token bucket per tenant holding one minute's worth, refilled at
  the rate; a request that finds it empty gets 429 ``rate_limit_exceeded`` with Retry-After.

A request over a cap is a 400 naming the field, in the envelope of the route it came in on.
The buckets live in this process (a replica counts its own requests).
"""

from __future__ import annotations

import math
import time

from gateway.http.errors import BadRequest, RateLimited

TENANTS_TRACKED = 10_000  # buckets kept; past that the idlest are forgotten (they refill anyway)
OUTPUT_FIELDS = {"chat": ("max_tokens", "max_completion_tokens"), "responses": ("max_output_tokens",),
                 "messages": ("max_tokens",)}


class TenantLimits:
    def __init__(self, defaults, tenants: dict) -> None:
        """`defaults`: the [limits] section; `tenants`: name -> TenantSettings (their overrides)."""
        self._defaults = defaults
        self._tenants = {name: t for name, t in tenants.items()}
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens left, when)

    def _get(self, tenant: str, key: str):
        own = getattr(self._tenants.get(tenant), key, None)
        return getattr(self._defaults, key) if own is None else own

    def admit(self, tenant: str, now: float | None = None) -> None:
        """One request of `tenant` against its rate; RateLimited (429) when its bucket is empty."""
        rate = self._get(tenant, "requests_per_minute")
        if not rate:
            return
        now = time.monotonic() if now is None else now
        left, then = self._buckets.get(tenant, (rate, now))
        left = min(rate, left + (now - then) * rate / 60)
        if left < 1:
            self._buckets[tenant] = (left, now)
            wait = math.ceil((1 - left) * 60 / rate)
            raise RateLimited(f"This tenant is over its {rate:g} requests per minute; retry in {wait} s.", retry_after=wait)
        if tenant not in self._buckets and len(self._buckets) >= TENANTS_TRACKED:
            self._buckets.pop(min(self._buckets, key=lambda k: self._buckets[k][1]))
        self._buckets[tenant] = (left - 1, now)

    def check(self, tenant: str, body: dict, fmt: str) -> None:
        """400 when the request asks for more choices or output tokens than the tenant may."""
        n, cap = body.get("n"), self._get(tenant, "max_n")
        if fmt == "chat" and isinstance(n, int) and not isinstance(n, bool) and n > cap:
            raise BadRequest(f"'n' is {n}; this gateway relays at most {cap} choices per request.", param="n",
                             code="limit_exceeded")
        cap = self._get(tenant, "max_output_tokens")
        for name in OUTPUT_FIELDS.get(fmt, ()):
            value = body.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
                raise BadRequest(f"'{name}' is {value}; this gateway relays at most {cap} output tokens per request.",
                                 param=name, code="limit_exceeded")
