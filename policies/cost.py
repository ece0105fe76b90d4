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

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# Requests of lead a background summary needs to be written before a growing conversation
# stops fitting: it runs after one response and must be there before the request that overflows.
LEAD_REQUESTS = 2
# Output tokens of a summary per word of its limit (prose runs about 1.3 tokens a word).
SUMMARY_TOKENS_PER_WORD = 1.4
# A listed exact value and its separator, in tokens (about), and the kinds the summary block caps
# (paths, dates, numbers, names: policies/extraction.format_exact_values).
VALUE_TOKENS, CAPPED_VALUE_KINDS = 4, 4
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


def with_cache_rule(policy: Any, rule: Any, *, long_ttl: bool = False) -> Any:
    """`policy` with the cost-model inputs it leaves unset taken from the model's cache rule
    (``policies.prices.CacheRule``); `policy` itself when there is nothing to fill. ``long_ttl``:
    the client asks its conversation cached for the provider's long TTL (Anthropic's hour), so
    the prefixes an event rewrites are written at that TTL's rate (``cache_write_1h_rate``, else
    the rule's, else ``cache_write_rate``)."""
    update = {} if rule is None else {
        field: value for field, value in (("cached_input_rate", rule.read), ("cache_write_rate", rule.write),
                                          ("cache_min_tokens", rule.min_tokens), ("cache_step", rule.step))
        if getattr(policy, field) is None}
    if long_ttl:
        hour = policy.cache_write_1h_rate if policy.cache_write_1h_rate is not None else getattr(rule, "write_1h", None)
        if hour is not None:
            update["cache_write_rate"] = hour
    return policy.model_copy(update=update) if update else policy


def requests_on_path(history: list[dict]) -> int:
    """The client turns of a path: what an append-only client sent its requests with (each user
    message or run of tool results after an answer)."""
    return turns_after(history)[0]


def turns_after(history: list[dict], turns: int = 0, previous: str | None = None) -> tuple[int, str | None]:
    """``requests_on_path`` counted on from a prefix's (turns, last role): the count after
    `history`, and its last message's role."""
    for message in history:
        role = message.get("role")
        if role in ("user", "tool") and previous not in ("user", "tool"):
            turns += 1
        previous = role
    return turns, previous


def further_requests(requests_so_far: float) -> float:
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


def event_price(before: float, after: float, rates: Rates, *, idle: bool = False, kept: float = 0.0) -> float:
    """What the request carrying a compaction event pays beyond what an appended view costs.
    The view from its first changed token on is written to the cache (``kept``: the tokens before
    it, unchanged and still read from the cache); a write premium (``rates.write`` over 1:
    GPT-5.6 on, Anthropic) makes an event dearer, and it must save that much more to pay."""
    if idle:
        return (rates.write * after if cacheable(after, rates) else after) - before
    kept = min(kept, after)
    written = rates.write * (after - kept) if cacheable(after, rates) else after - kept
    return written + resent(kept, rates) - resent(before, rates)


def rewrite_premium(after: float, rates: Rates, *, idle: bool = False, kept: float = 0.0) -> float:
    """What a request pays for an ``after``-token view it rewrites from token ``kept`` on, beyond
    what it would pay reading the same view from the cache (``R`` of the interval rule): the new
    part written at the write rate, where a stable prefix is read at the cached rate. After an
    idle gap the cache has expired, so only the write premium over an uncached read is left (0
    without one)."""
    if idle:
        return max(0.0, (rates.write - 1) * after) if cacheable(after, rates) else 0.0
    return max(0.0, event_price(after, after, rates, kept=kept))


def event_interval(after: float, growth: float, rates: Rates, *, idle: bool = False, extra: float = 0.0,
                   kept: float = 0.0) -> float:
    """The cost-optimal number of requests between two compaction events of a view that
    settles at ``after`` tokens (rewritten from token ``kept`` on) and grows by ``growth`` tokens
    a request: L* = sqrt(2R / (c g)).

    Append-only between events, each request reads ``c * g`` more from the cache than the one
    before (c: the cached rate), so L requests after an event they have read ``c g L^2 / 2``
    beyond the settled view, against one rewrite ``R`` (``rewrite_premium`` plus ``extra``, e.g. a
    summary call) per L requests. Their sum per request, ``R / L + c g L / 2``, is least at L*.
    Dear writes or cheap reads space events out; a fast-growing session compacts more often.
    Unknown growth (0): no interval (``inf``)."""
    premium = rewrite_premium(after, rates, idle=idle, kept=kept) + extra
    step = rates.cached * growth
    if premium <= 0:
        return 0.0
    return math.inf if step <= 0 else math.sqrt(2 * premium / step)


def event_pays(before: float, after: float, further: float, rates: Rates, *, idle: bool = False,
               extra: float = 0.0, growth: float = 0.0, kept: float = 0.0) -> bool:
    """Does shrinking a ``before``-token view to ``after`` tokens pay (``extra``: anything else
    the event needs, e.g. a summary call; ``further``: the session's likely further requests;
    ``kept``: the view's prefix the event leaves as it was, still served from the cache)?

    With the session's observed ``growth`` per request, the event is priced by the interval rule
    (``event_interval``): it is due once what the view's excess costs on every request
    (``c * (before - after)``, in cached reads) has reached the least average cost of a whole
    cycle, ``c g L*`` = sqrt(2 R c g), i.e. once the view has grown about ``g L*`` past the size it
    settles at. Earlier, waiting is cheaper (the rewrite would come round again too soon); and
    its saving, priced over the requests until the next event is expected (L*, or the session's
    likely end if sooner), must cover what the event's request pays beyond an appended view.
    Without growth, the saving is priced over all of ``further``."""
    if after >= before:
        return False
    if idle:
        saving = resent(before, rates) - resent(after, rates)
        horizon = further
        if growth > 0:
            interval = event_interval(after, growth, rates, idle=idle, extra=extra, kept=kept)
            if saving < rates.cached * growth * interval:
                return False
            horizon = min(further, max(1.0, interval))
        return saving * horizon > event_price(before, after, rates, idle=idle, kept=kept) + extra
    # The same figures as ``event_price`` and ``rewrite_premium``, each resent prefix priced once:
    # view planning asks this of every round of the path (issue 29).
    held = resent(before, rates)
    settled = resent(after, rates)
    saving = held - settled  # on each later request
    kept = min(kept, after)
    written = rates.write * (after - kept) if cacheable(after, rates) else after - kept
    read = resent(kept, rates)
    horizon = further
    if growth > 0:
        # The interval rule's test, saving >= c g L* with L* = sqrt(2 R / (c g)), squared.
        premium = max(0.0, written + read - settled) + extra
        step = rates.cached * growth
        if saving < 0 or premium > 0 and saving * saving < 2 * premium * step:
            return False
        interval = 0.0 if premium <= 0 else math.inf if step <= 0 else math.sqrt(2 * premium / step)
        horizon = min(further, max(1.0, interval))
    return saving * horizon > written + read - held + extra


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
    pace: float = 0.0  # client tokens per request so far, on average (0: unknown)


def summary_due(case: SummaryCase, trigger_ratio: float, rates: Rates, *, fit_first: bool = True) -> bool:
    """Should a background summary be written now?

    Never below the profile's ``summary_trigger_ratio`` of the budget. A conversation that
    still fits as the client sent it gets one when its growth says it will stop fitting within
    ``LEAD_REQUESTS``. Before that, with ``fit_first`` (balanced, fidelity), none: the view can
    go as it came, and the provider caches it, so the bill never goes above direct. Without it
    (economy), one when the event it enables pays for the summary call too (``event_pays`` with
    the call as ``extra``, at the session's ``pace``): a long session re-reads its whole history
    on every request, and a smaller view pays a rewrite back within a few. One that does not fit
    gets one when what its smaller views save over the session's likely further requests exceeds
    the call's price.
    """
    if case.view_tokens < trigger_ratio * case.budget:
        return False
    price = summary_price(case.summary_input, case.summary_output, rates, cached_share=case.cached_share)
    if case.client_tokens <= case.budget:
        if case.client_tokens + LEAD_REQUESTS * max(0, case.growth) > case.budget:
            return True
        return not fit_first and event_pays(case.view_tokens, case.target_tokens, further_requests(case.requests),
                                            rates, extra=price, growth=case.pace)
    saving = rates.cached * max(0, case.view_tokens - case.target_tokens) * further_requests(case.requests)
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


def fold_price(view: float, fixed: float, summary_output: float, rates: Rates, *, fork: bool = True) -> float:
    """What folding a ``view``-token view's piled-up placeholders costs: the summary call (a
    cache fork re-reads the view at the read rate, else its input goes uncached; ``summary_output``
    tokens at the output rate) and the adoption's rewrite of the view from its summary block on
    (what follows the ``fixed`` instructions and tools)."""
    call = fork_price(view, 0, rates) if fork else view
    return call + summary_output * rates.output + rewrite_premium(view, rates, kept=fixed)


def summary_block_estimate(policy: Any, budget: int) -> float:
    """The summary block a first fold brings, at its profile's limits (a later one is measured):
    the summary (``summary_max_words``), the exact values of the kinds the block caps
    (``exact_values_limit`` each, ~``VALUE_TOKENS`` a value) and, with recall, the hidden-context
    index (``hidden_index_ratio`` of the budget)."""
    return (policy.summary_max_words * SUMMARY_TOKENS_PER_WORD + CAPPED_VALUE_KINDS * policy.exact_values_limit * VALUE_TOKENS
            + policy.recall * policy.hidden_index_ratio * budget)


def settle_size(floor: float, ceiling: float, *, pile: float, pile_growth: float, further: float,
                fold: Any, rates: Rates, held: float = 0.0, after: float | None = None) -> float:
    """The size (tokens) a compaction event settles a view at: the cheapest over the session's
    likely ``further`` requests, at least ``floor`` (the profile's ``view_target_ratio``) and at
    most ``ceiling`` (its ``compact_trigger_ratio``).

    Every request after an event reads the settled view at the cached rate, so a smaller size
    ``S`` is cheaper, down to what the view must hold: ``held`` tokens (instructions, tools, a
    summary block) and the placeholders of compacted rounds, which pile up (``pile`` tokens now,
    ``pile_growth`` more a request). Once the pile passes ``S`` only a summary folds it, at
    ``fold(S)`` (``fold_price``: the call and the adoption's rewrite), and ``after`` is held
    from then on (its summary block in place of the one held now). So each request reads ``max(S, held + pile)`` and each fold costs
    ``fold(S)``: a bigger size trades reads for fewer folds (in the steady state the pile folds
    every ``sqrt(2 F p / c)`` tokens, the interval rule's shape), and a session whose pile will
    not pass it before its likely end writes no summary at all. The count of folds is a step
    function of ``S``, so the candidates are ``floor`` and, for each count, the smallest size
    that needs no more; the cheapest over the horizon wins (the smallest on a tie)."""
    floor = max(1.0, floor)
    ceiling = max(floor, ceiling)
    growth, horizon = max(0.0, pile_growth), max(0, math.ceil(further))
    total = pile + growth * horizon
    if rates.cached <= 0 or horizon <= 0 or growth <= 0 or total <= floor:
        return floor

    def cost(size: float) -> float:
        return _reads_and_folds(size, pile, growth, horizon, held, held if after is None else after, rates.cached,
                                fold(size))

    best, best_cost = floor, cost(floor)
    folds = math.floor(total / floor)
    # k folds need a size just over total / (k + 1) (with many folds at the floor, the counts in
    # between differ by a few tokens of size: only the 8 nearest it and the 8 fewest are tried).
    counts = range(folds - 1, -1, -1) if folds <= 16 else [*range(folds - 1, folds - 9, -1), *range(7, -1, -1)]
    for k in counts:
        size = math.floor(total / (k + 1)) + 1
        if size > ceiling:
            break
        price = cost(size)
        if price < best_cost:
            best, best_cost = size, price
    return best


@lru_cache(maxsize=1 << 14)
def settle_for(floor: float, ceiling: float, pile: float, growth: float, further: float, held: float, after: float,
               fixed: float, output: float, fork: bool, rates: Rates) -> float:
    """``settle_size`` with each fold priced by ``fold_price`` (a summary of ``output`` tokens,
    ``fork``: a cache fork of the view), memoized: every request replays its whole path, with the
    same figures at every round but the newest."""
    return settle_size(floor, ceiling, pile=pile, pile_growth=growth, further=further, rates=rates, held=held,
                       after=after, fold=lambda size: fold_price(size, fixed, output, rates, fork=fork))


def _reads_and_folds(size: float, pile: float, growth: float, horizon: int, held: float, after: float,
                     cached: float, fold: float) -> float:
    """``settle_size``'s cost of settling at ``size`` over ``horizon`` requests: each reads
    ``max(size, held + pile)`` at the ``cached`` rate, the pile grows by ``growth`` a request and
    passing ``size`` costs a fold (``fold``), which resets it and holds ``after`` from then on.
    In closed form: the stretch up to the first fold, whole cycles from an empty pile, the rest."""
    def stretch(pile: float, held: float, steps: int) -> float:
        # max(size, held + pile + growth * j) for j = 1..steps: flat at `size`, then growing.
        flat = max(0, min(steps, math.floor((size - held - pile) / growth)))
        grown = steps - flat
        return size * flat + (held + pile) * grown + growth * (flat + 1 + steps) * grown / 2

    def until_fold(pile: float) -> int:  # requests until the pile passes `size` (that one folds)
        return max(1, math.floor((size - pile) / growth) + 1)

    first = min(horizon, until_fold(pile))
    reads = stretch(pile, held, first)
    if first == horizon and pile + growth * first <= size:
        return cached * reads
    left, cycle = horizon - first, until_fold(0.0)
    cycles, rest = divmod(left, cycle)
    reads += cycles * stretch(0.0, after, cycle) + (stretch(0.0, after, rest) if rest else 0.0)
    folds = 1 + cycles + (rest and growth * rest > size)
    return cached * reads + fold * folds
