"""Who is asking: tenant from the credential, session from the header (or a fingerprint).

The tenant is a stable hash of the client's credential, or the name of a configured tenant
whose key matches; the raw credential is never stored or logged. A session is always scoped by
its tenant, so two tenants using the same session id never meet.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from store.ledger import SessionRef

ANONYMOUS = "anonymous"


def credential_of(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return auth.strip() or request.headers.get("api-key", "").strip()


class Identity:
    def __init__(self, tenants: dict[str, str], session_header: str, fallback: str) -> None:
        self._tenants = [(name, key.encode()) for name, key in tenants.items()]
        self._header = session_header
        self._fallback = fallback
        self._cache: dict[str, str] = {}

    def tenant(self, request: web.Request) -> str:
        credential = credential_of(request)
        if not credential:
            return ANONYMOUS
        cached = self._cache.get(credential)
        if cached is not None:
            return cached
        tenant = None
        for name, key in self._tenants:
            if hmac.compare_digest(credential.encode(), key):
                tenant = name
        if tenant is None:
            tenant = "t_" + hashlib.blake2b(credential.encode(), digest_size=8, person=b"palimpsest-tnt").hexdigest()
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[credential] = tenant
        return tenant

    def session(self, request: web.Request, tenant: str, first_event_id: str | None) -> SessionRef | None:
        """The request's session, or None for pure pass-through (no header, fallback off)."""
        session_id = request.headers.get(self._header, "").strip()
        if session_id:
            return SessionRef(tenant, session_id[:256])
        if self._fallback == "fingerprint" and first_event_id is not None:
            # Safe because the ledger is content-addressed: conversations that share the
            # first message share only that prefix, and diverge as branches.
            return SessionRef(tenant, "fp:" + first_event_id)
        return None
