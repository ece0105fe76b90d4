"""Tokens the gateway may spend on one tenant's behalf: a token bucket per tenant.

Summary calls are the gateway's own upstream calls, paid with the operator's key (or the
client's), and their size follows the history a client sends: one 1.4 MB request could cause
hundreds of thousands of summary tokens. Each tenant gets ``summary.tenant_tokens_per_hour``,
refilled continuously up to one hour's worth. A call reserves its estimate before it is sent
(so parallel parts of one job cannot all slip through) and settles to what the upstream reported.
When the bucket cannot cover a call, the call is not made: the job writes deterministic state
instead (``gateway.jobs.summarizer``), one warning names the tenant (never content), and
``palimpsest_tenant_budget_exceeded_total`` counts it.

Before any of that, a catch-up must pay at all (``catch_up_pays``, issue 29): a request that
brings a long history the gateway never held (an arrival) goes out tailored with the exact
values and recall tools; folding its whole history is priced by the cost model against the
one request the session has run here, and waits until the session goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from policies import Policy, TokenCounter
from policies.cost import SUMMARY_TOKENS_PER_WORD, SummaryCase, cost_rates, requests_seen, summary_due

log = logging.getLogger("palimpsest.budget")
TENANTS_TRACKED = 10_000
HOUR_S = 3600.0


class TenantBudget:
    def __init__(self, tokens_per_hour: int, metrics=None, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = tokens_per_hour  # 0 = unlimited
        self._rate = tokens_per_hour / HOUR_S
        self._metrics = metrics
        self._clock = clock
        self._level: dict[str, tuple[float, float]] = {}  # tenant -> (tokens available, when)

    def available(self, tenant: str) -> float:
        if not self.capacity:
            return float("inf")
        now = self._clock()
        level, then = self._level.get(tenant, (float(self.capacity), now))
        return min(float(self.capacity), level + (now - then) * self._rate)

    def reserve(self, tenant: str, tokens: int, kind: str = "summary") -> bool:
        """Take `tokens` from the tenant's bucket, or refuse (False) without taking any."""
        if not self.capacity:
            return True
        level = self.available(tenant)
        if tokens > level:
            if self._metrics is not None:
                self._metrics.tenant_budget_exceeded.labels(kind).inc()
            log.warning("tenant token budget exhausted: gateway call skipped", extra={"fields": {
                "tenant": tenant, "kind": kind, "tokens_needed": tokens, "tokens_available": int(level),
                "tokens_per_hour": self.capacity}})
            return False
        self._store(tenant, level - tokens)
        return True

    def settle(self, tenant: str, reserved: int, spent: int, kind: str = "summary") -> None:
        """Give back what a call reserved and did not spend (or take what it spent beyond)."""
        if self._metrics is not None:
            self._metrics.tenant_budget_tokens.labels(kind).inc(spent)
        if self.capacity:
            self._store(tenant, self.available(tenant) + reserved - spent)

    def _store(self, tenant: str, level: float) -> None:
        if tenant not in self._level and len(self._level) >= TENANTS_TRACKED:
            # Tenants whose bucket has refilled are the same as untracked ones: forget them first.
            full = [t for t in self._level if self.available(t) >= self.capacity]
            for t in full or list(self._level)[: TENANTS_TRACKED // 10]:
                del self._level[t]
        self._level[tenant] = (level, self._clock())


def catch_up_pays(history: list[dict], ids: list[str], policy: Policy, budget: int, counter: TokenCounter) -> bool:
    """Does folding an arrival's whole history pay, by the cost model's rule
    (``policies/cost.summary_due``)? Its request goes out tailored to the budget either way;
    the summary would settle later views at ``view_target_ratio`` of it, a saving over the
    session's likely further requests, which for an arrival are one (``requests_seen``). The
    fold reads the whole history uncached (the tailored view is no cache fork) and writes a
    summary. Without the cost model (``cost_model = false``) the ratios decide: it pays."""
    if not policy.cost_model:
        return True
    tokens = sum(counter.count_message(m, k) for m, k in zip(history, ids))
    case = SummaryCase(client_tokens=tokens, view_tokens=budget, budget=budget, growth=0,
                       requests=requests_seen(0, arrived=True), summary_input=tokens,
                       summary_output=int(policy.summary_max_words * SUMMARY_TOKENS_PER_WORD),
                       target_tokens=int(policy.view_target_ratio * budget))
    return summary_due(case, policy.summary_trigger_ratio, cost_rates(policy))
