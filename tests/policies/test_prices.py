"""Reading what the provider billed, and prices: policies/prices.py."""

from __future__ import annotations

import pytest

from policies.prices import KNOWN_PRICES, CacheUsage, Price, price_of, read_usage


def test_chat_usage_splits_the_cached_prefix_from_the_prompt():
    usage = {"prompt_tokens": 5000, "completion_tokens": 40,
             "prompt_tokens_details": {"cached_tokens": 4096}}
    assert read_usage(usage) == CacheUsage(uncached=904, cached=4096, cache_write=0, output=40)


def test_responses_usage_reads_input_tokens_details():
    usage = {"input_tokens": 3000, "output_tokens": 12, "input_tokens_details": {"cached_tokens": 2048}}
    assert read_usage(usage) == CacheUsage(952, 2048, 0, 12)


def test_anthropic_usage_counts_reads_and_writes_beside_input():
    usage = {"input_tokens": 20, "cache_read_input_tokens": 9000, "cache_creation_input_tokens": 1500,
             "output_tokens": 300}
    billed = read_usage(usage)
    assert billed == CacheUsage(20, 9000, 1500, 300)
    assert billed.prompt == 10520


@pytest.mark.parametrize("usage", [None, [], "x", {"prompt_tokens": "abc"}, {"prompt_tokens": -5},
                                   {"prompt_tokens": True}, {"input_tokens": float("nan")}])
def test_odd_usage_reads_as_zero_never_raises(usage):
    assert read_usage(usage).prompt == 0


def test_cached_over_the_prompt_is_capped():
    assert read_usage({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 500}}).cached == 100


def test_price_by_longest_prefix_and_provider_prefix():
    assert price_of("gpt-4o-mini-2024-07-18") == KNOWN_PRICES["gpt-4o-mini"]
    assert price_of("gpt-4o-2024-08-06") == KNOWN_PRICES["gpt-4o"]
    assert price_of("openai/gpt-4.1-nano") == KNOWN_PRICES["gpt-4.1-nano"]
    assert price_of("fake-32k") is None


def test_anthropic_prices_write_at_1_25x_and_read_at_0_1x():
    sonnet = price_of("claude-sonnet-4-5-20250929")
    assert (sonnet.cached_input, sonnet.cache_write) == (pytest.approx(0.3), pytest.approx(3.75))


def test_overrides_replace_the_fields_they_set():
    price = price_of("gpt-4o", {"gpt-4o": {"input": 2.0, "cached_input": None, "output": None}})
    assert price == Price(2.0, 1.25, 2.50, 10.0)
    own = price_of("my-model", {"my-model": {"input": 1.0, "output": 3.0}})
    assert own == Price(1.0, 0.1, 1.0, 3.0)
    assert price_of("my-model", {"my-model": {"output": 3.0}}) is None


def test_cost_in_dollars():
    price = Price(input=2.0, cached_input=0.5, cache_write=2.5, output=8.0)
    assert price.cost(CacheUsage(1_000_000, 2_000_000, 0, 500_000)) == pytest.approx(2.0 + 1.0 + 4.0)
    assert price.cached_rate == 0.25


# -- cache rules as data (issue 29 item 2) ---------------------------------------------------------

from policies.cost import Rates, cost_rates, event_pays, with_cache_rule  # noqa: E402
from policies.policy import Policy  # noqa: E402
from policies.prices import CacheUsage, cache_rule, price_of, read_usage  # noqa: E402


def test_openai_cache_writes_are_read_from_both_apis_and_taken_out_of_the_uncached_count():
    chat = {"prompt_tokens": 7521, "completion_tokens": 21,
            "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 6001}}
    assert read_usage(chat) == CacheUsage(1520, 0, 6001, 21)
    responses = {"input_tokens": 7546, "output_tokens": 9,
                 "input_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 6002}}
    assert read_usage(responses) == CacheUsage(544, 1000, 6002, 9)
    # A count over what is left is capped, never negative.
    assert read_usage({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 50}}) \
        == CacheUsage(0, 8, 2, 0)


def test_anthropic_writes_keep_their_ttl_split_and_the_hour_is_billed_at_its_rate():
    usage = {"input_tokens": 10, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 300,
             "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200}, "output_tokens": 7}
    billed = read_usage(usage)
    assert billed == CacheUsage(10, 500, 300, 7, 200)
    price = price_of("claude-sonnet-4-5")
    assert price.cache_write == 3.75 and price.cache_write_1h == 6.0
    assert round(price.cost(billed) * 1e6, 6) == round(10 * 3 + 500 * 0.3 + 100 * 3.75 + 200 * 6.0 + 7 * 15, 6)


def test_cache_rules_per_family():
    assert cache_rule("fake-32k") is None  # nobody listed it: the policy's rates, OpenAI's lengths
    old = cache_rule("gpt-4o-2024-08-06", price_of("gpt-4o-2024-08-06"))
    assert (old.min_tokens, old.step, old.read, old.write, old.breakpoints) == (1024, 128, 0.5, 1.0, "implicit")
    new = cache_rule("gpt-5.6-2026-09-01", price_of("gpt-5.6-2026-09-01"))
    assert (new.step, new.write, new.breakpoints, new.max_breakpoints) == (1, 1.25, "prompt_cache_breakpoint", 4)
    assert round(new.read, 6) == 0.1
    assert price_of("gpt-5.6").cache_write == round(1.25 * price_of("gpt-5.6").input, 6)  # the family's premium priced
    claude = cache_rule("anthropic/claude-3-5-haiku-latest")
    assert (claude.min_tokens, claude.write, claude.write_1h, claude.breakpoints) == (2048, 1.25, 2.0, "cache_control")
    assert cache_rule("gemini-2.5-pro").min_tokens == 4096 and cache_rule("gemini-2.5-flash").min_tokens == 2048
    assert new.cacheable(1500) == 1500 and old.cacheable(1500) == 1408 and old.cacheable(1000) == 0


def test_the_policy_takes_the_models_rule_unless_the_operator_set_the_rates():
    rule = cache_rule("gpt-5.6", price_of("gpt-5.6"))
    rates = cost_rates(with_cache_rule(Policy(), rule))
    assert (rates.write, rates.step) == (1.25, 1)
    assert cost_rates(with_cache_rule(Policy(cache_write_rate=1.0), rule)).write == 1.0
    assert cost_rates(Policy()) == Rates()


def test_a_client_asking_an_hour_prices_the_rewrites_at_the_hours_write_rate():
    claude = cache_rule("claude-sonnet-4-5", price_of("claude-sonnet-4-5"))
    assert cost_rates(with_cache_rule(Policy(), claude)).write == 1.25
    assert cost_rates(with_cache_rule(Policy(), claude, long_ttl=True)).write == 2.0
    # The operator's own rates: the long one when set, else the one write rate it gave.
    assert cost_rates(with_cache_rule(Policy(cache_write_rate=1.25, cache_write_1h_rate=1.9), None, long_ttl=True)).write == 1.9
    assert cost_rates(with_cache_rule(Policy(cache_write_rate=1.25), None, long_ttl=True)).write == 1.25


def test_a_write_premium_enters_the_compaction_events_payback():
    # 20k -> 6k tokens with 1 further request: worth it at no write premium, not at 1.25x.
    free, premium = Rates(0.1, 1.0), Rates(0.1, 1.25)
    before, after = 20_000, 6_000
    further = next(n for n in range(1, 100) if event_pays(before, after, n, free))
    assert not event_pays(before, after, further, premium)
    assert event_pays(before, after, further + 2, premium)


def test_only_models_that_take_explicit_breakpoints_get_them():
    from gateway.responses.cache_breakpoints import place_breakpoints

    items = [{"type": "message", "role": "developer", "content": "summary"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]},
             {"type": "function_call_output", "call_id": "c", "output": "x"}]
    assert place_breakpoints("gpt-5-mini", items) is items and place_breakpoints("fake-32k", items) is items
    marked = place_breakpoints("gpt-5.6", items)
    assert marked[0]["content"] == [{"type": "input_text", "text": "summary", "prompt_cache_breakpoint": {"mode": "explicit"}}]
    assert marked[1]["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit"} and marked[2] is items[2]
    assert "prompt_cache_breakpoint" not in items[1]["content"][0]  # the client's items are never changed
