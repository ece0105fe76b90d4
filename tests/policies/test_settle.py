"""The settle size chosen by the cost model (issue 29, item 3): policies/cost.settle_size, and
the view plan's use of it (policies/compaction.plan_view, ``settled``)."""

from __future__ import annotations

from policies import Policy
from policies.compaction import plan_view
from policies.cost import Rates, fold_price, settle_size, summary_block_estimate

RATES = Rates(cached=0.1, write=1.0, output=4.0)
FLOOR, CEILING = 3_200, 20_800


def size(pile: float, growth: float, further: float, rates: Rates = RATES, *, held: float = 1_500,
         after: float = 1_900, output: float = 980) -> float:
    return settle_size(FLOOR, CEILING, pile=pile, pile_growth=growth, further=further, rates=rates,
                       fold=lambda s: fold_price(s, 600, output, rates), held=held, after=after)


def test_a_pile_that_stays_under_the_floor_settles_at_the_floor():
    assert size(500, 50, 20) == FLOOR  # 1,500 tokens of placeholders by the session's likely end
    assert size(3_000, 0, 100) == FLOOR  # no growth observed: the profile's size
    assert size(3_000, 60, 0) == FLOOR  # no further requests expected


def test_a_fold_due_just_before_the_session_s_likely_end_is_not_bought():
    # 1,000 + 60 x 40 = 3,400 by the end: settling 201 tokens bigger costs ~0.1 x 201 a request;
    # folding at the floor would cost the summary call and its rewrite for a few requests' saving.
    chosen = size(1_000, 60, 40)
    assert FLOOR < chosen <= 1_000 + 60 * 40 + 1


def test_a_long_session_folds_at_the_floor_when_reads_dominate():
    # 3,000 + 60 x 200 = 15,000 tokens of placeholders: the pile must fold several times whatever
    # the size, and a bigger one is read by every request.
    assert size(3_000, 60, 200) == FLOOR


def test_dear_reads_settle_smaller_and_dear_writes_bigger():
    cheap_reads = size(3_000, 200, 60)
    dear_reads = size(3_000, 200, 60, Rates(cached=0.25, write=1.0, output=4.0))
    assert dear_reads <= cheap_reads and dear_reads == FLOOR < cheap_reads
    premium = Rates(cached=0.1, write=1.25, output=4.0)
    assert size(2_500, 60, 40, premium) > size(2_500, 60, 40) == FLOOR


def test_a_fold_that_saves_little_is_not_bought():
    # The summary block a fold brings is as big as the pile it folds: settle over the whole pile.
    assert size(3_000, 60, 60, after=1_500 + 3_000) == 3_000 + 60 * 60 + 1
    # A small block: folding pays (at least once before the likely end).
    assert size(3_000, 60, 60, after=1_500 + 300, output=100) < 3_000 + 60 * 60


def test_the_size_stays_within_the_floor_and_the_ceiling():
    for pile, growth, further in [(0, 10, 10), (3_000, 60, 60), (20_000, 500, 400), (9_000, 5, 2_000)]:
        chosen = size(pile, growth, further, after=1_500 + 5_000)
        assert FLOOR <= chosen <= CEILING


def test_the_first_fold_s_block_is_estimated_at_the_profile_s_limits():
    policy = Policy()
    assert summary_block_estimate(policy, 32_000) > policy.summary_max_words  # summary, values, index
    assert summary_block_estimate(policy.model_copy(update={"recall": False}), 32_000) < summary_block_estimate(policy, 32_000)


def _plan(policy: Policy, n: int, budget: int = 32_000):
    # An agent loop: rounds of 1,500 tokens that compact to 120 (call, placeholder, answer).
    raw, compacted = [1_500] * n, [120] * n
    settled: list[float] = []
    plan = plan_view([(2 * i, 2 * i + 2) for i in range(n)], raw, compacted, 600, [], policy, budget, settled=settled)
    return plan, settled[0]


def test_the_plan_settles_where_the_cost_model_chose_and_at_the_profile_s_size_without_it():
    policy = Policy(compact_keep_rounds=1)
    floor = policy.view_target_ratio * 32_000
    _, early = _plan(policy, 10)
    assert early == floor  # the pile (1,200 tokens) will not pass the floor by the likely end
    _, later = _plan(policy, 30)
    assert later > floor  # 3,600 tokens of placeholders: folding them is dearer than reading them
    _, off = _plan(policy.model_copy(update={"cost_model": False}), 30)
    assert off == floor


def test_a_plan_with_a_chosen_size_is_stable_as_the_path_grows():
    """Each request's replay keeps every frontier an earlier request had (the settle size of a
    round is decided on the rounds before it)."""
    policy = Policy(compact_keep_rounds=1)
    previous = 0
    for n in range(1, 60):
        (_, frontier), _ = _plan(policy, n)
        assert frontier >= previous
        previous = frontier


def test_the_fold_of_piled_up_placeholders_is_due_past_the_chosen_size(counter):
    from policies.planner import plan, settling_policy
    from tests.policies.conversations import session
    from tests.policies.test_planner import request

    req = request(counter, session(12, result_words=400), view_target_ratio=0.1)
    planned = plan(req)
    planned.compacted_tokens, planned.raw_tail_tokens = 20_000, 700
    planned.settle_tokens = 0.25 * req.budget  # the plan's choice, over the pile: no fold yet
    assert settling_policy(req.policy, planned, req.budget) is req.policy
    planned.settle_tokens = 0.15 * req.budget  # under it: the fold is due, past the chosen size
    settled = settling_policy(req.policy, planned, req.budget)
    assert settled.summary_trigger_ratio == 0.15 and settled.keep_recent_tokens == 700
