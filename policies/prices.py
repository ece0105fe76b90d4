"""What a provider bills: the cached share of a call's usage, and well-known models' prices.

``read_usage`` takes the ``usage`` object of any of the three APIs and returns one shape:

- Chat Completions: ``prompt_tokens`` (cached included), ``prompt_tokens_details.cached_tokens``;
- Responses: ``input_tokens`` (cached included), ``input_tokens_details.cached_tokens``;
- Anthropic Messages: ``input_tokens`` (neither cache read nor write included),
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``.

Prices are US dollars per million tokens: input, cached input (a cache read), cache write and
output. OpenAI caches automatically and bills no write (a write costs the input price);
Anthropic reads at 0.1x and writes at 1.25x of input.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """One call's tokens as billed: prompt tokens split three ways, and output."""

    uncached: int = 0
    cached: int = 0
    cache_write: int = 0
    output: int = 0

    @property
    def prompt(self) -> int:
        return self.uncached + self.cached + self.cache_write

    def __add__(self, other: "CacheUsage") -> "CacheUsage":
        return CacheUsage(self.uncached + other.uncached, self.cached + other.cached,
                          self.cache_write + other.cache_write, self.output + other.output)


def _count(value) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)) and value == value and 0 <= value < float("inf"):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return 0


def _detail(usage: dict, group: str, key: str) -> int:
    details = usage.get(group)
    return _count(details.get(key)) if isinstance(details, dict) else 0


def read_usage(usage) -> CacheUsage:
    """Cached, uncached and cache-write prompt tokens and output tokens of a ``usage`` object
    of Chat Completions, Responses or Anthropic Messages (anything else reads as zero)."""
    if not isinstance(usage, dict):
        return CacheUsage()
    if "prompt_tokens" in usage:  # Chat Completions
        prompt = _count(usage.get("prompt_tokens"))
        cached = min(prompt, _detail(usage, "prompt_tokens_details", "cached_tokens"))
        return CacheUsage(prompt - cached, cached, 0, _count(usage.get("completion_tokens")))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic
        return CacheUsage(_count(usage.get("input_tokens")), _count(usage.get("cache_read_input_tokens")),
                          _count(usage.get("cache_creation_input_tokens")), _count(usage.get("output_tokens")))
    prompt = _count(usage.get("input_tokens"))  # Responses (and Anthropic without cache fields)
    cached = min(prompt, _detail(usage, "input_tokens_details", "cached_tokens"))
    return CacheUsage(prompt - cached, cached, 0, _count(usage.get("output_tokens")))


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    cache_write: float
    output: float

    def cost(self, usage: CacheUsage) -> float:
        return (usage.uncached * self.input + usage.cached * self.cached_input
                + usage.cache_write * self.cache_write + usage.output * self.output) / 1e6

    @property
    def cached_rate(self) -> float:
        """A cached input token's price as a share of an uncached one."""
        return self.cached_input / self.input if self.input else 0.1


def _openai(input: float, cached: float, output: float) -> Price:
    return Price(input, cached, input, output)


def _anthropic(input: float, output: float) -> Price:
    return Price(input, round(input * 0.1, 6), round(input * 1.25, 6), output)


# List prices (standard tier) of well-known models; a name matches its longest prefix here, so
# dated snapshots ("gpt-4o-2024-08-06") take their family's price. [models."x"] overrides.
KNOWN_PRICES: dict[str, Price] = {
    "gpt-4o": _openai(2.50, 1.25, 10.00),
    "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
    "gpt-4.1": _openai(2.00, 0.50, 8.00),
    "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
    "gpt-5": _openai(1.25, 0.125, 10.00),
    "gpt-5-mini": _openai(0.25, 0.025, 2.00),
    "gpt-5-nano": _openai(0.05, 0.005, 0.40),
    "o3": _openai(2.00, 0.50, 8.00),
    "o4-mini": _openai(1.10, 0.275, 4.40),
    "claude-opus-4": _anthropic(15.00, 75.00),
    "claude-sonnet-4": _anthropic(3.00, 15.00),
    "claude-3-7-sonnet": _anthropic(3.00, 15.00),
    "claude-haiku-4": _anthropic(1.00, 5.00),
    "claude-3-5-haiku": _anthropic(0.80, 4.00),
}


def price_of(model: str, overrides: dict[str, dict[str, float | None]] | None = None) -> Price | None:
    """The model's price: the well-known table (longest matching prefix, a ``provider/``
    prefix ignored), with the fields set in ``overrides[model]`` replacing the table's. None
    when nothing is known (an override naming only some fields of an unknown model fills the
    rest from its input price: cached input 0.1x, cache write 1x, output 4x)."""
    name = model.rsplit("/", 1)[-1].lower()
    base = next((KNOWN_PRICES[k] for k in sorted(KNOWN_PRICES, key=len, reverse=True) if name.startswith(k)), None)
    given = {k: v for k, v in ((overrides or {}).get(model) or {}).items() if v is not None}
    if not given:
        return base
    if base is None:
        if "input" not in given:
            return None
        base = Price(given["input"], given["input"] * 0.1, given["input"], given["input"] * 4)
    return Price(given.get("input", base.input), given.get("cached_input", base.cached_input),
                 given.get("cache_write", base.cache_write), given.get("output", base.output))
