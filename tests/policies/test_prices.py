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
