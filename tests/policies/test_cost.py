"""The cost model: policies/cost.py, and the view plan's use of it (policies/compaction.plan_view)."""

from __future__ import annotations

from policies import Policy
from policies.compaction import plan_view
from policies.cost import (LEAD_REQUESTS, Rates, SummaryCase, event_pays, event_price, further_requests,
                           summary_due, summary_price)

RATES = Rates(cached=0.1, write=1.0, output=4.0)


def test_an_event_pays_only_when_the_saving_over_further_requests_exceeds_the_rewrite():
    # 20,480 -> 5,120: the rewrite costs 5,120 - 2,048 = 3,072; each later request saves 1,536.
    assert event_price(20_480, 5_120, RATES) == 3_072
    assert not event_pays(20_480, 5_120, 2, RATES)
    assert event_pays(20_480, 5_120, 3, RATES)
    assert not event_pays(20_480, 20_480, 100, RATES)  # nothing shrinks: nothing to buy
    # A summary the event needs is part of its price.
    assert not event_pays(20_480, 5_120, 3, RATES, extra=2_000)


def test_under_the_cache_minimum_every_resend_is_full_price_so_shrinking_always_pays():
    assert event_price(900, 300, RATES) == 300 - 900
    assert event_pays(900, 300, 0, RATES)


def test_an_idle_session_rewrites_nearly_free():
    # The cache has expired: the unchanged view would be uncached too.
    assert event_price(20_480, 5_120, RATES, idle=True) == -15_360
    assert event_pays(20_480, 5_120, 0.5, RATES, idle=True)


def test_anthropic_cache_writes_make_rewrites_dearer():
    anthropic = Rates(cached=0.1, write=1.25, output=5.0)
    assert event_pays(20_480, 5_120, 2.5, RATES) and not event_pays(20_480, 5_120, 2.5, anthropic)


def test_further_requests_follow_the_sessions_record():
    assert further_requests(0) == 0 and further_requests(1) == 1 and further_requests(90) == 90


def test_a_cache_forked_summary_is_billed_mostly_cached():
    assert summary_price(100_000, 1_000, RATES) == 104_000
    assert summary_price(100_000, 1_000, RATES, cached_share=0.9) == 10_000 + 9_000 + 4_000


def case(**kw) -> SummaryCase:
    base = dict(client_tokens=100_000, view_tokens=100_000, budget=120_000, growth=50, requests=2,
                summary_input=100_000, summary_output=1_000, target_tokens=12_000)
    return SummaryCase(**{**base, **kw})


def test_a_conversation_that_fits_gets_no_summary_until_its_growth_needs_one():
    assert not summary_due(case(), 0.75, RATES)  # 100k of 120k, growing 50 a request
    # Growing 10k a request: it stops fitting within LEAD_REQUESTS, so the summary is due now.
    assert summary_due(case(growth=10_001), 0.75, RATES)
    assert not summary_due(case(client_tokens=100_000, growth=(120_000 - 100_000) // LEAD_REQUESTS), 0.75, RATES)


def test_the_profile_trigger_stays_the_earliest_point():
    assert not summary_due(case(view_tokens=80_000, growth=50_000), 0.75, RATES)


def test_a_conversation_that_does_not_fit_gets_a_summary_when_it_pays():
    over = dict(client_tokens=300_000, view_tokens=28_000, budget=30_000, target_tokens=3_000, summary_input=40_000)
    # Saving 2,500 a request: a one-request arrival does not repay 44k; a long session does.
    assert not summary_due(case(requests=1, **over), 0.75, RATES)
    assert summary_due(case(requests=30, **over), 0.75, RATES)
    # Cached, the same summary repays itself sooner.
    assert summary_due(case(requests=8, cached_share=0.9, **over), 0.75, RATES)
    assert not summary_due(case(requests=8, **over), 0.75, RATES)


def rounds_of(sizes: list[int]) -> list[tuple[int, int]]:
    return [(2 * i, 2 * i + 2) for i in range(len(sizes))]


def test_view_plan_skips_an_event_that_does_not_pay_and_takes_it_when_it_does():
    # view_target_ratio 0.45: the rounds before the third stay under it, so no early event
    # (the interval rule, tests below) comes first.
    policy = Policy(compact_trigger_ratio=0.5, view_target_ratio=0.45, sync_compaction_ratio=0.9,
                    keep_recent_rounds=1, compact_batch_rounds=1, summary_trigger_ratio=0.5)
    budget = 10_000
    # Three rounds of 2,000 raw (200 once compacted): over the trigger at the third round, but
    # three rounds of history say about three more requests: the rewrite does not pay yet.
    raw, compacted = [2_000] * 3, [200] * 3
    assert plan_view(rounds_of(raw), raw, compacted, 0, [], policy, budget) == (None, 0)
    off = policy.model_copy(update={"cost_model": False})
    assert plan_view(rounds_of(raw), raw, compacted, 0, [], off, budget)[1] > 0
    # Many small rounds before: the same view after a long session pays for its rewrite.
    raw2, compacted2 = [50] * 40 + [2_000] * 3, [50] * 40 + [200] * 3
    assert plan_view(rounds_of(raw2), raw2, compacted2, 0, [], policy, budget)[1] > 0


def test_view_plan_compacts_whatever_it_costs_over_the_sync_ratio():
    policy = Policy(compact_trigger_ratio=0.5, view_target_ratio=0.1, sync_compaction_ratio=0.55,
                    keep_recent_rounds=1, compact_batch_rounds=1, summary_trigger_ratio=0.5)
    raw, compacted = [2_000] * 3, [200] * 3
    assert plan_view(rounds_of(raw), raw, compacted, 0, [], policy, 10_000)[1] > 0


def test_a_fork_is_the_summary_form_only_where_re_reading_the_view_costs_less_than_the_transcript():
    from policies.cost import fork_pays, fork_price, transcript_price

    openai, premium = Rates(), Rates(write=1.25)
    # A 14k-token view folding a 1.5k-token delta: 0.1 x 14k + 1k added is dearer than 1.5k uncached.
    assert fork_price(14_080, 1_000, openai) == 0.1 * 14_080 + 1_000  # 110 steps of 128
    assert not fork_pays(14_000, 1_000, 1_500, openai)
    # The same view folding 12k of delta: the fork pays.
    assert fork_pays(14_000, 1_000, 12_000, openai)
    # A write premium prices the implicitly cached transcript up; Anthropic's (no breakpoint) is not written.
    assert transcript_price(2_000, premium, written=True) == 2_500
    assert transcript_price(2_000, premium, written=False) == 2_000
    assert fork_pays(14_000, 700, 2_000, premium, written=True) is (0.1 * 14_000 + 700 <= 2_500)


# --- early events: the interval rule under the trigger (issue 29) ------------------------------


def _loop_plan(policy: Policy, n: int, raw_size: int = 1_500, last: int | None = None):
    raw, compacted = [raw_size] * n, [40] * n
    if last is not None:
        raw[-1] = last
    events: list = []
    plan = plan_view(rounds_of(raw), raw, compacted, 2_000, [], policy, 30_000, events)
    return plan, [e for e in events if e.reason != "deferred"]


def test_an_event_that_rewrites_little_comes_before_the_trigger():
    policy = Policy(compact_keep_rounds=1)
    high = policy.compact_trigger_ratio * 30_000
    _, events = _loop_plan(policy, 40)
    assert events and all(e.reason == "cost_model" and e.tokens_before <= high for e in events)
    # The view stays far under the trigger after the first event, so every request reads less.
    assert max(e.tokens_before for e in events[1:]) < 0.5 * high
    # Without the cost model the profile's trigger alone decides: events only over it.
    _, off = _loop_plan(policy.model_copy(update={"cost_model": False}), 40)
    assert off and all(e.tokens_before > high for e in off)


def test_an_event_that_rewrites_more_waits_longer():
    # Keeping 3 raw rounds, each event rewrites the 2 consumed ones it keeps: events are spaced out.
    _, cheap = _loop_plan(Policy(compact_keep_rounds=1), 40)
    _, dear = _loop_plan(Policy(compact_keep_rounds=3), 40)
    assert len(dear) < len(cheap)
    assert min(b.round - a.round for a, b in zip(dear[1:], dear[2:])) > 1


def test_early_events_are_stable_as_the_path_grows():
    """Each request's replay of the path (its newest round partial: an answer joins it later)
    keeps every frontier an earlier request had: a placeholder never comes back raw."""
    policy = Policy(compact_keep_rounds=1)
    previous = 0
    for n in range(1, 41):
        (_, frontier), _ = _loop_plan(policy, n + 1, last=200)  # n complete rounds, the newest partial
        assert frontier >= previous
        previous = frontier
    assert previous > 0
