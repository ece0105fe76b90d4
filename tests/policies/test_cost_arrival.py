"""An arrival's catch-up summary by the cost model's own rule (policies/cost.requests_seen,
issue 29 item 5): priced against the one request the session has run, it never pays; once the
session goes on, the conversation's own turns count, and it does."""

from __future__ import annotations

from policies.cost import Rates, SummaryCase, requests_seen, summary_due

RATES = Rates(cached=0.1, write=1.0, output=4.0)


def arrival(requests: int) -> SummaryCase:
    # A LongMemEval-like haystack: ~105k tokens in 250 turns, tailored to a 31k budget, folded
    # uncached (a tailored view is no cache fork) into a ~1k-token summary.
    return SummaryCase(client_tokens=105_000, view_tokens=31_000, budget=31_000, growth=0, requests=requests,
                       summary_input=105_000, summary_output=980, target_tokens=3_100)


def test_an_arrival_counts_one_request_whatever_turns_it_carries():
    assert requests_seen(250, arrived=True) == 1
    assert requests_seen(250, arrived=False) == 250
    assert requests_seen(1, arrived=False) == 1


def test_an_arrivals_catch_up_waits_until_the_session_goes_on():
    assert not summary_due(arrival(requests_seen(250, arrived=True)), 0.75, RATES)
    assert summary_due(arrival(requests_seen(251, arrived=False)), 0.75, RATES)


def test_no_arrival_of_any_size_repays_its_fold_in_one_request():
    # The one further request saves at most the cached view (cached * budget); the fold reads
    # more than the budget uncached: the rule cannot say yes, whatever the rates.
    for tokens in (31_001, 60_000, 500_000):
        for rates in (RATES, Rates(cached=0.5, write=1.25, output=1.0), Rates(cached=1.0, output=0.0)):
            case = SummaryCase(client_tokens=tokens, view_tokens=31_000, budget=31_000, growth=0,
                               requests=requests_seen(400, arrived=True), summary_input=tokens,
                               summary_output=0, target_tokens=0)
            assert not summary_due(case, 0.75, rates)
