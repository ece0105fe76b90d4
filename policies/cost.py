"""Whether a compaction event or a summary job pays for itself (docs/architecture.md, "Views"
and "Summary jobs").

Prices are counted in uncached input tokens: a cached input token costs ``cached`` (0.1 on
OpenAI's and Anthropic's current models), a token written to the cache ``write`` (1.0 on
OpenAI, which bills no write; 1.25 on Anthropic) and an output token ``output``.

A provider caches the prefix a session's requests share, so a growing conversation whose view
only appends is billed mostly at the cached rate. A compaction event rewrites the prefix: the
request that carries it pays its new view uncached (``write * after``) where it would have read
the old one from the cache (``cached * before``). What it buys is a smaller view on every later
request, ``cached * (before - after)`` each. The session's likely further requests are read off
its own record: a session that has run ``n`` requests is about as likely as not to run ``n``
more (the Lindy estimate; an agent loop of 90 steps keeps going, a one-shot question does not).
An idle session's cache has expired, so its next request is uncached whatever happens; that
makes the rewrite nearly free (``idle``).

The window still wins: when the view must shrink to fit, the event happens whatever it costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Requests of lead a background summary needs to be written before a growing conversation
# stops fitting: it runs after one response and must be there before the request that overflows.
LEAD_REQUESTS = 2
# Output tokens of a summary per word of its limit (prose runs about 1.3 tokens a word).
SUMMARY_TOKENS_PER_WORD = 1.4
# Without a cache rule: no prefix under 1024 tokens is cached, longer ones in steps of 128 (OpenAI).
CACHE_MIN_TOKENS, CACHE_STEP = 1024, 128


@dataclass(frozen=True, slots=True)
class Rates:
    """Prices relative to an uncached input token, and the provider's cacheable lengths."""

    cached: float = 0.1
    write: float = 1.0
    output: float = 4.0
    min_tokens: int = CACHE_MIN_TOKENS
    step: int = CACHE_STEP


def cost_rates(policy: Any) -> Rates:
    """The policy's price ratios and cache lengths (``cached_input_rate``, ``cache_write_rate``,
    ``output_rate``, ``cache_min_tokens``, ``cache_step``; unset ones the defaults)."""
    def given(value, default):
        return default if value is None else value

    return Rates(given(policy.cached_input_rate, 0.1), given(policy.cache_write_rate, 1.0), policy.output_rate,
                 given(policy.cache_min_tokens, CACHE_MIN_TOKENS), given(policy.cache_step, CACHE_STEP))


def with_cache_rule(policy: Any, rule: Any) -> Any:
    """`policy` with the cost-model inputs it leaves unset taken from the model's cache rule
    (``policies.prices.CacheRule``); `policy` itself when there is nothing to fill."""
    if rule is None:
        return policy
    update = {field: value for field, value in (("cached_input_rate", rule.read), ("cache_write_rate", rule.write),
                                                ("cache_min_tokens", rule.min_tokens), ("cache_step", rule.step))
              if getattr(policy, field) is None}
    return policy.model_copy(update=update) if update else policy


def further_requests(requests_so_far: int) -> float:
    """The session's likely further requests, on its own record (the Lindy estimate)."""
    return float(max(0, requests_so_far))


def cacheable(tokens: float, rates: Rates | None = None) -> float:
    """The part of a repeated prefix a provider serves from its cache."""
    low, step = (rates.min_tokens, rates.step) if rates is not None else (CACHE_MIN_TOKENS, CACHE_STEP)
    return 0 if tokens < low else tokens // step * step


def resent(tokens: float, rates: Rates) -> float:
    """A view sent again unchanged: its cacheable part at the cached rate, the rest in full."""
    cached = cacheable(tokens, rates)
    return rates.cached * cached + tokens - cached


def event_price(before: float, after: float, rates: Rates, *, idle: bool = False) -> float:
    """What the request carrying a compaction event pays beyond what an appended view costs.
    The rewritten view is written to the cache whole: a write premium (``rates.write`` over 1:
    GPT-5.6 on, Anthropic) makes an event dearer, and it must save that much more to pay."""
    written = rates.write * after if cacheable(after, rates) else after
    return written - (before if idle else resent(before, rates))


def event_pays(before: float, after: float, further: float, rates: Rates, *, idle: bool = False,
               extra: float = 0.0) -> bool:
    """Does shrinking a ``before``-token view to ``after`` tokens save more over ``further``
    requests than it costs (``extra``: anything else the event needs, e.g. a summary call)?"""
    if after >= before:
        return False
    saving = (resent(before, rates) - resent(after, rates)) * further
    return saving > event_price(before, after, rates, idle=idle) + extra


def summary_price(input_tokens: float, output_tokens: float, rates: Rates, *, cached_share: float = 0.0) -> float:
    """A summary call: its input (the share served from the provider's cache at the cached
    rate) and its output."""
    return (input_tokens * (1 - cached_share) + input_tokens * cached_share * rates.cached
            + output_tokens * rates.output)


def fork_price(view_tokens: float, added_tokens: float, rates: Rates) -> float:
    """A cache-forked summary call's input: the view just sent, re-read from the cache (its
    cacheable part at the read rate), plus what the fork adds (the answer and the instruction),
    which no breakpoint covers: paid uncached."""
    return resent(view_tokens, rates) + added_tokens


def transcript_price(tokens: float, rates: Rates, *, written: bool) -> float:
    """A transcript-form summary call's input: all of it new to the cache. ``written``: the
    provider caches it implicitly and bills the write (OpenAI's GPT-5.6 on); with explicit
    breakpoints (Anthropic) a call that sets none pays it uncached, without the write."""
    return rates.write * tokens if written and cacheable(tokens, rates) else tokens


def fork_pays(view_tokens: float, added_tokens: float, transcript_tokens: float, rates: Rates, *,
              written: bool = True) -> bool:
    """Is the cache fork the cheaper form of a summary call? A fork re-reads the whole view at
    the read rate; the transcript form sends only the delta (tool results trimmed) and the
    instruction, uncached. A small delta under a big view is cheaper as a transcript."""
    return fork_price(view_tokens, added_tokens, rates) <= transcript_price(transcript_tokens, rates, written=written)


@dataclass(frozen=True, slots=True)
class SummaryCase:
    """What a summary decision knows about a session after a response."""

    client_tokens: int  # the client's request as it came
    view_tokens: int  # the view that was sent
    budget: int  # the prompt budget of the request's model
    growth: int  # client tokens added since the session's previous request (0: unknown)
    requests: int  # requests of the session so far, this one included
    summary_input: int  # tokens the summary call would read
    summary_output: int  # tokens it would write
    target_tokens: int  # the view an event settles at once the summary exists
    cached_share: float = 0.0  # of the summary call's input, served from the provider's cache


def summary_due(case: SummaryCase, trigger_ratio: float, rates: Rates) -> bool:
    """Should a background summary be written now?

    Never below the profile's ``summary_trigger_ratio`` of the budget. A conversation that
    still fits as the client sent it gets one only when its growth says it will stop fitting
    within ``LEAD_REQUESTS`` (before that, any summary is a cost without a saving: the view can
    go as it came, and the provider caches it). One that does not fit gets one when what its
    smaller views save over the session's likely further requests exceeds the call's price.
    """
    if case.view_tokens < trigger_ratio * case.budget:
        return False
    if case.client_tokens <= case.budget:
        return case.client_tokens + LEAD_REQUESTS * max(0, case.growth) > case.budget
    saving = rates.cached * max(0, case.view_tokens - case.target_tokens) * further_requests(case.requests)
    price = summary_price(case.summary_input, case.summary_output, rates, cached_share=case.cached_share)
    return saving > price


def requests_seen(turns_on_path: int, arrived: bool) -> int:
    """The session's requests so far, for ``further_requests`` (issue 29, item 5). A request
    that brought a history the gateway held none of (an *arrival*: a client switching to the
    gateway with a long conversation, a one-shot question over a pasted haystack) has run one
    request here, whatever turns it carries: whether it goes on is unknown until a second one
    comes, so a catch-up summary of it is priced against one further request and waits (it
    never pays). From the second request on, the conversation's own turns count, as for any
    session (``turns_on_path``)."""
    return 1 if arrived else turns_on_path
