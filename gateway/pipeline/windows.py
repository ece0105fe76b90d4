"""Context windows: configuration first, then what the upstream's /v1/models says, then a
small table of well-known models, then a conservative default.

With several upstreams (``gateway/http/routing.py``) each is asked about its own models only:
a model's window is discovered from the upstream that serves it, in that upstream's format, and
each upstream's answer is cached apart."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import orjson

log = logging.getLogger("palimpsest.windows")

DEFAULT_WINDOW = 16_384
DISCOVERY_TTL_S = 600.0
# Fields OpenAI-compatible servers use for the window (vLLM, OpenRouter, LM Studio, llama.cpp...).
WINDOW_FIELDS = ("context_window", "context_length", "max_model_len", "max_context_length", "n_ctx", "max_input_tokens")
KNOWN = (
    ("gpt-4.1", 1_047_576), ("gpt-4o", 128_000), ("gpt-4-turbo", 128_000), ("gpt-5", 400_000),
    ("o1", 200_000), ("o3", 200_000), ("o4", 200_000), ("gpt-3.5-turbo", 16_385), ("gpt-4", 8_192),
    # Anthropic: every current Claude model takes 200k without the long-context beta.
    ("claude-", 200_000),
)


def window_from_model_entry(entry: dict) -> int | None:
    for name in WINDOW_FIELDS:
        value = entry.get(name)
        if isinstance(value, int) and value > 0:
            return value
    meta = entry.get("meta") or entry.get("top_provider") or {}
    if isinstance(meta, dict):
        for name in WINDOW_FIELDS + ("n_ctx_train",):
            value = meta.get(name)
            if isinstance(value, int) and value > 0:
                return value
    return None


class _Discovered:
    """One upstream's answer: windows by model, and when it was asked."""

    def __init__(self) -> None:
        self.windows: dict[str, int] = {}
        self.fetched_at: float | None = None  # None: never asked (monotonic() may be small on a fresh host)
        self.lock = asyncio.Lock()

    def stale(self) -> bool:
        return self.fetched_at is None or time.monotonic() - self.fetched_at > DISCOVERY_TTL_S


class Windows:
    def __init__(self, configured: dict[str, int], upstream) -> None:
        """`upstream`: the upstreams routed by model (``Upstreams``), or one upstream."""
        self._configured = configured
        self._route = upstream.for_model if hasattr(upstream, "for_model") else (lambda model: upstream)
        self._asked: dict[str, _Discovered] = {}  # by upstream name

    async def window(self, model: str, auth: Mapping[str, str] | None = None) -> int:
        """The model's window; `auth` is the client's credential headers, for discovery when the
        gateway has no upstream key of its own."""
        if model in self._configured:
            return self._configured[model]
        upstream = self._route(model)
        found = self._asked.setdefault(getattr(upstream, "name", "default"), _Discovered())
        if model not in found.windows and found.stale():
            await self._discover(upstream, found, auth)
        if model in found.windows:
            return found.windows[model]
        for prefix, size in KNOWN:
            if model.startswith(prefix):
                return size
        return DEFAULT_WINDOW

    async def _discover(self, upstream, found: _Discovered, auth: Mapping[str, str] | None) -> None:
        async with found.lock:
            if not found.stale():
                return
            found.fetched_at = time.monotonic()
            key = upstream.api_key
            client = dict(auth or {})  # the client's credential headers (Authorization, api-key or x-api-key)
            if getattr(upstream, "format", "openai") == "anthropic":
                # Anthropic's models endpoint: x-api-key and a version header (max_input_tokens per model).
                headers = {**({"x-api-key": key} if key else client), "anthropic-version": "2023-06-01"}
            else:
                headers = {"Authorization": f"Bearer {key}"} if key else client
            try:
                async with upstream.request(upstream.api, "GET", upstream.url("/v1/models"), headers=headers) as resp:
                    if resp.status != 200:
                        return
                    data = orjson.loads(await resp.read())
            except Exception as exc:  # discovery is best effort; the default still protects
                log.warning("model window discovery failed: %s", type(exc).__name__)
                return
            for entry in data.get("data") or ():
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    size = window_from_model_entry(entry)
                    if size:
                        found.windows[entry["id"]] = size
