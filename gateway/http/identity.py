"""Who is asking: tenant from the credential, session from the header (or a fingerprint).

The credential is ``Authorization`` (Bearer), Azure-style ``api-key`` or Anthropic's ``x-api-key``
(Claude Code sends only that one). The tenant is a stable hash of it, or the name of a configured tenant
whose key matches; the raw credential is never stored or logged. A session is always scoped by
its tenant, so two tenants using the same session id never meet.

With client keys required (``server.client_keys``; by default whenever any operator key is set,
because the gateway then spends it on the client's behalf), a request whose key is missing or
not one of ``[tenants]`` gets a 401 before anything else happens. The admin token is never a
client key (it would be forwarded upstream): it gets the same 401.

A tenant may have a provider key of its own (``[tenants.NAME] upstream_key``); `tenant` notes
it on the request (`UPSTREAM_KEY`), and the upstream client uses it instead of the operator's.

Without the session header, the headers well-known agent clients send on every request name
the session (``session.headers``, in order: Codex's ``session-id`` then ``thread-id``, Claude
Code's ``X-Claude-Code-Session-Id``). Without any of them, the request passes through unrecorded unless
``session.fallback = "fingerprint"``, which names the session by the credential's tenant and
the first message: everyone behind one key who opens with the same words shares that session
(and may recall each other's turns), so it is off by default.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from gateway.http.errors import BadRequest, Unauthorized
from gateway.keys import UPSTREAM_KEY
from store.records import SessionRef

ANONYMOUS = "anonymous"


def credential_of(request: web.Request) -> str:
    """The client's key: Authorization (Bearer or bare), Azure's api-key, or Anthropic's x-api-key."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return auth.strip() or request.headers.get("api-key", "").strip() or request.headers.get("x-api-key", "").strip()


def _raw(credential: str) -> bytes:
    """The credential's bytes as the client sent them (undecodable bytes included)."""
    return credential.encode("utf-8", "surrogateescape")


class Identity:
    def __init__(self, tenants: dict[str, str], session_header: str, fallback: str, *, require_key: bool = False,
                 upstream_keys: dict[str, str] | None = None, admin_token: str = "",
                 client_headers: tuple[str, ...] = ()) -> None:
        self._tenants = [(name, key.encode()) for name, key in tenants.items()]
        self._upstream_keys = {name: key for name, key in (upstream_keys or {}).items() if key}
        self._admin = admin_token.encode()
        self._header = session_header
        self._client_headers = client_headers  # what well-known clients send, in order (session.headers)
        self._fallback = fallback
        self.require_key = require_key
        self._cache: dict[str, str] = {}

    def tenant(self, request: web.Request) -> str:
        """The request's tenant; Unauthorized (401) when a client key is required and this
        request has none of the configured ones."""
        tenant = self._tenant(credential_of(request))
        request[UPSTREAM_KEY] = self._upstream_keys.get(tenant, "")
        return tenant

    def upstream_key(self, tenant: str) -> str:
        """The tenant's own provider key, or "" (the operator's key, or the client's, is used)."""
        return self._upstream_keys.get(tenant, "")

    def _tenant(self, credential: str) -> str:
        if self._admin and hmac.compare_digest(_raw(credential), self._admin):
            raise Unauthorized("The admin token is not a client API key.")
        if not credential:
            if self.require_key:
                raise Unauthorized("This gateway requires a client API key (Authorization: Bearer <key>, or x-api-key: <key>).")
            return ANONYMOUS
        cached = self._cache.get(credential)
        if cached is not None:
            return cached
        tenant = None
        for name, key in self._tenants:
            if hmac.compare_digest(_raw(credential), key):
                tenant = name
        if tenant is None:
            if self.require_key:
                raise Unauthorized("Incorrect API key provided: this gateway accepts only its configured client keys.")
            tenant = "t_" + hashlib.blake2b(_raw(credential), digest_size=8, person=b"palimpsest-tnt").hexdigest()
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[credential] = tenant
        return tenant

    def session(self, request: web.Request, tenant: str, first_event_id: str | None) -> SessionRef | None:
        """The request's session, or None for pure pass-through (no header, fallback off)."""
        session_id = request.headers.get(self._header, "").strip()
        for name in self._client_headers:
            if session_id:
                break
            session_id = request.headers.get(name, "").strip()
        if session_id:
            try:
                session_id.encode()
            except UnicodeEncodeError:  # aiohttp hands undecodable header bytes over as surrogates
                raise BadRequest(f"The {self._header} header must be UTF-8 text.", param=self._header) from None
            return SessionRef(tenant, session_id[:256])
        if self._fallback == "fingerprint" and first_event_id is not None:
            # Safe because the ledger is content-addressed: conversations that share the
            # first message share only that prefix, and diverge as branches.
            return SessionRef(tenant, "fp:" + first_event_id)
        return None
