"""Several upstreams, routed by model (docs/architecture.md, "Upstreams").

``Upstreams`` holds the default ``[upstream]`` and every ``[upstreams.NAME]``, each an
``Upstream`` of its own (its base URL, format, key, pool). A request goes to the first named
upstream whose globs match its model, else to the default one (``settings.upstream_for``); what
the gateway does on a session's behalf (summary calls, window discovery) goes to the upstream of
the session's model. A tenant's own provider keys are per upstream: ``upstream_key`` for the
default one, ``upstream_keys.NAME`` for a named one, and a key goes only to the upstream it is
named for (another upstream gets its own operator key, or the client's credential).
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.upstream import Upstream
from gateway.keys import UPSTREAM_KEY, UPSTREAM_NAME
from gateway.settings import DEFAULT_UPSTREAM, Settings


class Upstreams:
    def __init__(self, settings: Settings, default: Upstream, named: dict[str, Upstream],
                 tenant_keys: dict[str, dict[str, str]] | None = None) -> None:
        self._settings = settings
        self.default = default
        self._named = named
        self._tenant_keys = tenant_keys or {}  # tenant -> upstream name -> key

    def for_model(self, model: str | None) -> Upstream:
        """The upstream that serves `model`."""
        name = self._settings.upstream_for(model)
        return self._named[name] if name != DEFAULT_UPSTREAM else self.default

    def all(self) -> list[Upstream]:
        return [self.default, *self._named.values()]

    def __len__(self) -> int:
        return 1 + len(self._named)

    def tenant_key(self, tenant: str | None, upstream: Upstream) -> str:
        """The tenant's own key for `upstream`, or "" (its operator key, else the client's credential)."""
        return self._tenant_keys.get(tenant or "", {}).get(upstream.name, "")

    def route(self, request: web.Request, tenant: str | None, model: str | None) -> Upstream:
        """The upstream of `model`, noted on the request with the tenant's key for it (the one
        key every later step of the request passes on)."""
        upstream = self.for_model(model)
        request[UPSTREAM_KEY] = self.tenant_key(tenant, upstream)
        request[UPSTREAM_NAME] = upstream.name
        return upstream

    async def start(self) -> None:
        for upstream in self.all():
            await upstream.start()

    async def close(self) -> None:
        for upstream in self.all():
            await upstream.close()


def build_upstreams(settings: Settings) -> Upstreams:
    """Every configured upstream (not started); the named ones share [upstream]'s timeouts."""
    base = settings.upstream
    timeouts = dict(connect_timeout=base.connect_timeout_s, read_timeout=base.read_timeout_s,
                    first_byte_timeout=base.first_byte_timeout_s, idle_timeout=base.idle_timeout_s,
                    max_connections=base.max_connections)
    default = Upstream(base.base_url, base.api_key.get_secret_value(), format=base.format, **timeouts)
    named = {name: Upstream(u.base_url, u.api_key.get_secret_value(), format=u.format, name=name,
                            summary_model=u.summary_model, embeddings_url=u.embeddings_url, **timeouts)
             for name, u in settings.upstreams.items()}
    keys: dict[str, dict[str, str]] = {}
    for tenant, t in settings.tenant_table().items():
        own = {name: k.get_secret_value() for name, k in t.upstream_keys.items() if k.get_secret_value()}
        if t.upstream_key.get_secret_value():
            own[DEFAULT_UPSTREAM] = t.upstream_key.get_secret_value()
        if own:
            keys[tenant] = own
    return Upstreams(settings, default, named, keys)
