"""What upstream calls cost, and what sending direct would have cost (docs/architecture.md,
"Metrics and logs").

Every upstream call the gateway makes is counted once, by model and by caller: ``client`` (the
first call of a client's request), ``recall`` (the recall loop's further rounds) and
``summary`` (summary jobs). The provider's own usage says how much of the prompt it served from
its cache (``policies.prices.read_usage``); prices come from ``policies.prices`` with the
``[models."x"]`` overrides.

The direct counterfactual is the client's request sent as it came, with the provider's cache
(its rule from ``policies.prices.cache_rule``: the shortest cached prefix, the step, the TTL,
and for a provider that bills writes, the part it did not read is written):
a client's history is append-only, so the prefix the provider would have cached for it is the
session's previous request, when this request's path extends that one's and it came within the
cache's lifetime. It is kept per session in a bounded memo (per replica: a request answered by
another replica counts as uncached). ``palimpsest_saved_vs_direct_usd`` is direct minus billed
since the process started; it goes negative when the gateway cost more.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge

from policies.prices import OPENAI_CACHE, CacheRule, CacheUsage, Price, cache_rule, price_of, read_usage

# OpenAI keeps a prefix 5-10 minutes after its last use (longer off-peak): the direct client of a
# model without a longer TTL is given the generous end, so the saving is never overstated by an
# early expiry.
DIRECT_CACHE_TTL_S = 600.0
SESSION_MEMO = 50_000
PRICE_MEMO = 1024  # model names are the client's: bounded


class Costs:
    def __init__(self, registry: CollectorRegistry, prices: dict[str, dict] | None = None) -> None:
        p, r = "palimpsest_", registry
        self.tokens = Counter(p + "upstream_billed_tokens_total", "Prompt tokens of upstream calls by how the provider "
                              "billed them (kind: cached, uncached, cache_write), by model and caller (client, recall, summary).",
                              ["model", "caller", "kind"], registry=r)
        self.cost = Counter(p + "cost_usd_total", "What upstream calls cost, US dollars, by model and caller (models with a known price).",
                            ["model", "caller"], registry=r)
        self.direct_cost = Counter(p + "direct_cost_usd_total", "What the client's requests would have cost sent direct, "
                                   "with the provider's cache (the session's previous request as cached prefix).", ["model"], registry=r)
        self.saved = Gauge(p + "saved_vs_direct_usd", "Direct cost minus billed cost since start, US dollars (negative: the gateway cost more).",
                           ["model"], registry=r)
        self._overrides = prices or {}
        self._prices: dict[str, Price | None] = {}
        self._rules: dict[str, CacheRule] = {}
        self._last: OrderedDict[str, tuple[int, str, int, float]] = OrderedDict()

    def price(self, model: str) -> Price | None:
        if model not in self._prices:
            if len(self._prices) >= PRICE_MEMO:
                self._prices.clear()
            self._prices[model] = price_of(model, self._overrides)
        return self._prices[model]

    def rule(self, model: str) -> CacheRule:
        """The model's cache rule (policies/prices.py); OpenAI's when nobody listed it."""
        if model not in self._rules:
            if len(self._rules) >= PRICE_MEMO:
                self._rules.clear()
            self._rules[model] = cache_rule(model, self.price(model)) or OPENAI_CACHE
        return self._rules[model]

    def call(self, model: str, label: str, caller: str, usage) -> CacheUsage:
        """Count one upstream call's usage; returns it as billed."""
        billed = read_usage(usage)
        for kind, n in (("cached", billed.cached), ("uncached", billed.uncached),
                        ("cache_write", billed.cache_write - billed.cache_write_1h), ("cache_write_1h", billed.cache_write_1h)):
            if n:
                self.tokens.labels(label, caller, kind).inc(n)
        price = self.price(model)
        if price is not None and (billed.prompt or billed.output):
            spent = price.cost(billed)
            self.cost.labels(label, caller).inc(spent)
            self.saved.labels(label).dec(spent)
        return billed

    def direct(self, model: str, label: str, session_key: str | None, ids: list[str], client_tokens: int,
               output_tokens: int, now: float | None = None, cached: int = 0) -> CacheUsage:
        """What this request would have been billed sent direct; counted when the price is known.
        Without a session `cached` is what the provider reported (the request went as it came)."""
        now = time.monotonic() if now is None else now
        rule = self.rule(model)
        if session_key is not None:
            previous = self._last.pop(session_key, None)
            if previous is not None:
                length, last_id, tokens, seen = previous
                if (now - seen <= max(DIRECT_CACHE_TTL_S, rule.ttl_s) and 0 < length <= len(ids) and ids[length - 1] == last_id):
                    cached = min(rule.cacheable(tokens), client_tokens)
            if ids:
                self._last[session_key] = (len(ids), ids[-1], client_tokens, now)
                while len(self._last) > SESSION_MEMO:
                    self._last.popitem(last=False)
        # A provider that bills writes bills the direct client's too: the cacheable part it did
        # not read is written (the client's history is the next request's prefix).
        written = max(0, rule.cacheable(client_tokens) - cached) if rule.write > 1.0 else 0
        direct = CacheUsage(client_tokens - cached - written, cached, written, output_tokens)
        price = self.price(model)
        if price is not None:
            spent = price.cost(direct)
            self.direct_cost.labels(label).inc(spent)
            self.saved.labels(label).inc(spent)
        return direct
