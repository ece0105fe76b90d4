"""The interval rule of compaction events (issue 29, item 3): an event's saving is priced until
the next event, and events space out at L* = sqrt(2R / (c g)) requests."""

from __future__ import annotations

import math

from policies import Policy, plan_view
from policies.compaction import PlanEvent
from policies.cost import (Rates, SummaryCase, event_interval, event_pays, event_price, requests_by_round,
                           rewrite_premium, summary_due)

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


def rounds_of(sizes: list[int]) -> list[tuple[int, int]]:
    return [(2 * i, 2 * i + 2) for i in range(len(sizes))]


def events_of(rates: Rates, rounds: int = 120) -> list[PlanEvent]:
    """The events a view plan takes on a long loop of 1,000-token results (100 once compacted)."""
    policy = Policy(compact_trigger_ratio=0.02, view_target_ratio=0.01, sync_compaction_ratio=0.9,
                    keep_recent_rounds=2, compact_batch_rounds=1, summary_trigger_ratio=0.5,
                    cached_input_rate=rates.cached, cache_write_rate=rates.write, cache_step=1)
    raw, compacted = [1_000] * rounds, [100] * rounds
    events: list[PlanEvent] = []
    plan_view(rounds_of(raw), raw, compacted, 2_000, [], policy, 200_000, events)
    return [e for e in events if e.reason != "deferred"]


def test_events_space_out_when_reads_are_cheap_and_writes_dear_and_vice_versa():
    sparse, dense = events_of(CHEAP_READS_DEAR_WRITES), events_of(DEAR_READS_CHEAP_WRITES)
    assert dense and sparse
    assert len(dense) > 2 * len(sparse)
    gap = lambda events: (events[-1].round - events[0].round) / max(1, len(events) - 1)  # noqa: E731
    assert gap(sparse) > 2 * gap(dense)
    # Each event waits for at least half the excess the rule asks of a whole rewritten view
    # (less than all of it: the old placeholders stay a cached prefix, only the rest is rewritten).
    for event in sparse[1:]:
        excess = event.tokens_before - event.tokens_after
        assert excess >= 0.5 * 1_000 * event_interval(event.tokens_after, 1_000, CHEAP_READS_DEAR_WRITES)


def test_requests_per_round_price_each_round_as_the_reads_it_carries():
    """Two requests per round (a call, then the answer after its result) read the view twice: the
    same rounds are worth compacting sooner than at one request a round."""
    policy = Policy(compact_trigger_ratio=0.02, view_target_ratio=0.01, sync_compaction_ratio=0.9,
                    keep_recent_rounds=2, compact_batch_rounds=1, summary_trigger_ratio=0.5, cache_step=1)
    raw, compacted = [1_000] * 80, [100] * 80
    once, twice = [], []
    plan_view(rounds_of(raw), raw, compacted, 2_000, [], policy, 200_000, once)
    plan_view(rounds_of(raw), raw, compacted, 2_000, [], policy, 200_000, twice, requests=[2 * (n + 1) for n in range(80)])
    taken = lambda events: [e for e in events if e.reason != "deferred"]  # noqa: E731
    assert len(taken(twice)) > len(taken(once))


def fitting(**over) -> SummaryCase:
    base = dict(client_tokens=60_000, view_tokens=60_000, budget=120_000, growth=500, requests=120,
                summary_input=60_000, summary_output=600, target_tokens=6_000, cached_share=0.9, pace=500)
    return SummaryCase(**{**base, **over})


def test_economy_summarises_a_long_session_that_fits_when_it_pays_and_balanced_never_does():
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


def test_an_appended_round_never_changes_an_earlier_event():
    """The plan replays the path on every request: a decision at a round uses only what was known
    by then (its growth and requests so far), so the frontier never moves back and a placeholder
    never comes back raw."""
    policy = Policy(compact_trigger_ratio=0.02, view_target_ratio=0.01, sync_compaction_ratio=0.9,
                    keep_recent_rounds=2, compact_batch_rounds=1, summary_trigger_ratio=0.5, cache_step=1)
    raw = [400 + (n * 7919) % 2_500 for n in range(90)]
    compacted = [min(r, 120) for r in raw]
    # A client request per user message or run of tool results after an answer, up to each round.
    history = [{"role": r} for r in ("user", "assistant", "tool", "assistant", "user", "assistant")]
    assert requests_by_round(history, [(0, 3), (3, 5), (5, 6)]) == [2, 3, 3]
    whole: list[PlanEvent] = []
    plan_view(rounds_of(raw), raw, compacted, 2_000, [], policy, 200_000, whole, requests=[2 * n + 1 for n in range(90)])
    frontiers = []
    for k in range(1, 91):
        events: list[PlanEvent] = []
        frontiers.append(plan_view(rounds_of(raw[:k]), raw[:k], compacted[:k], 2_000, [], policy, 200_000, events,
                                   requests=[2 * n + 1 for n in range(k)])[1])
        assert events == [e for e in whole if e.round < k]
    assert frontiers == sorted(frontiers) and frontiers[-1] > 0
