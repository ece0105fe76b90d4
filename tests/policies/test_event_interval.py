"""The interval rule of compaction events (issue 29, item 3): an event's saving is priced until
the next event, and events space out at L* = sqrt(2R / (c g)) requests. (Pure functions only:
on this branch the view plan does not call the rule yet.)"""

from __future__ import annotations

import math

from policies.cost import Rates, SummaryCase, event_interval, event_pays, event_price, rewrite_premium, summary_due

CHEAP_READS_DEAR_WRITES = Rates(cached=0.05, write=2.0, step=1)
DEAR_READS_CHEAP_WRITES = Rates(cached=0.5, write=1.0, step=1)


def test_the_interval_is_the_square_root_rule():
    rates = Rates(cached=0.1, write=1.25, step=1)
    premium = rewrite_premium(8_000, rates)
    assert premium == 1.25 * 8_000 - 0.1 * 8_000
    assert math.isclose(event_interval(8_000, 2_000, rates), math.sqrt(2 * premium / (0.1 * 2_000)))
    # Dear writes and cheap reads space events out; dear reads and cheap writes bring them closer.
    assert event_interval(8_000, 2_000, CHEAP_READS_DEAR_WRITES) > 4 * event_interval(8_000, 2_000, DEAR_READS_CHEAP_WRITES)
    # A faster-growing session compacts more often; a summary to pay for (extra) less often.
    assert event_interval(8_000, 4_000, rates) < event_interval(8_000, 1_000, rates)
    assert event_interval(8_000, 2_000, rates, extra=5_000) > event_interval(8_000, 2_000, rates)
    # After an idle gap the cache is gone anyway: with no write premium a rewrite is free.
    assert event_interval(8_000, 2_000, Rates(step=1), idle=True) == 0.0


def test_an_event_is_due_once_the_view_has_grown_past_its_settle_size_by_the_optimal_interval():
    rates = Rates(cached=0.1, write=1.0, step=1)
    settle, growth = 8_000, 1_000
    due = growth * event_interval(settle, growth, rates)  # about 12k tokens of excess
    assert not event_pays(settle + 0.8 * due, settle, 1_000, rates, growth=growth)
    assert event_pays(settle + 1.1 * due, settle, 1_000, rates, growth=growth)
    # Priced until the next event or the session's likely end, whichever is sooner: a session
    # about to end does not rewrite its view for two more requests.
    assert not event_pays(settle + 1.1 * due, settle, 2, rates, growth=growth)
    # Without an observed growth, the saving is priced over all further requests (the Lindy rule).
    assert event_pays(settle + 0.3 * due, settle, 1_000, rates)


def fitting(**over) -> SummaryCase:
    base = dict(client_tokens=60_000, view_tokens=60_000, budget=120_000, growth=500, requests=120,
                summary_input=60_000, summary_output=600, target_tokens=6_000, cached_share=0.9, pace=500)
    return SummaryCase(**{**base, **over})


def test_without_fit_first_a_long_session_that_fits_is_summarised_when_it_pays_and_with_it_never():
    rates = Rates(cached=0.1, write=1.25, step=1)
    assert summary_due(fitting(), 0.3, rates, fit_first=False)
    assert not summary_due(fitting(), 0.3, rates, fit_first=True)  # fit first: billed as direct
    # One request so far (a big arrival) says about one more: it does not repay the summary and the rewrite.
    assert not summary_due(fitting(requests=1, pace=60_000), 0.3, rates, fit_first=False)
    # A small excess over the settle size is not worth the rewrite yet.
    assert not summary_due(fitting(client_tokens=40_000, view_tokens=12_000, summary_input=12_000), 0.05,
                           rates, fit_first=False)


def test_a_prefix_the_event_leaves_as_it_was_is_not_rewritten():
    """Moving the frontier rewrites the view from the first newly compacted round on; what
    precedes it (system, tools, the placeholders of earlier events) is still read from the cache."""
    rates = Rates(cached=0.1, write=1.25, step=1)
    assert event_price(20_000, 10_000, rates, kept=6_000) == 1.25 * 4_000 + 0.1 * 6_000 - 0.1 * 20_000
    assert rewrite_premium(10_000, rates, kept=6_000) < rewrite_premium(10_000, rates)
    assert event_interval(10_000, 1_000, rates, kept=6_000) < event_interval(10_000, 1_000, rates)
    before = 10_000 + 1_000 * event_interval(10_000, 1_000, rates, kept=6_000) * 1.05
    assert event_pays(before, 10_000, 1_000, rates, growth=1_000, kept=6_000)
    assert not event_pays(before, 10_000, 1_000, rates, growth=1_000)
