"""What a provider bills: the cached share of a call's usage, well-known models' prices, and
each provider's prompt-cache rules, as data.

``read_usage`` takes the ``usage`` object of any of the three APIs and returns one shape:

- Chat Completions: ``prompt_tokens`` (cached and written included),
  ``prompt_tokens_details.cached_tokens`` and ``.cache_write_tokens`` (GPT-5.6 on);
- Responses: ``input_tokens`` (likewise), ``input_tokens_details.cached_tokens`` and
  ``.cache_write_tokens``;
- Anthropic Messages: ``input_tokens`` (neither cache read nor write included),
  ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and its TTL split
  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``.

Prices are US dollars per million tokens: input, cached input (a cache read), cache write,
cache write under the 1-hour TTL, and output. OpenAI before GPT-5.6 bills no write (a write
costs the input price); from GPT-5.6 on a write costs 1.25x. Anthropic reads at 0.1x and writes
at 1.25x of input (2x with the 1-hour TTL).

``CacheRule`` says how a model's provider caches a prompt prefix (``cache_rule``): the shortest
prefix it caches, the step cached lengths grow in, its read and write rates, how long an unused
prefix lives, and where a request marks the prefix (implicitly; Anthropic's ``cache_control``;
OpenAI's ``prompt_cache_breakpoint`` from GPT-5.6 on, ``{"mode": "explicit"}`` on an input
content part, at most 4 writes per request, one of them the implicit breakpoint's). Sources:
OpenAI's and Anthropic's prompt-caching guides; Gemini's implicit caching (2,048 tokens for
Flash, 4,096 for Pro, read at 0.1x).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """One call's tokens as billed: prompt tokens split three ways, and output."""

    uncached: int = 0
    cached: int = 0
    cache_write: int = 0  # every token written to the cache, the 1-hour ones included
    output: int = 0
    cache_write_1h: int = 0  # of cache_write, the tokens written under a 1-hour TTL

    @property
    def prompt(self) -> int:
        return self.uncached + self.cached + self.cache_write

    def __add__(self, other: "CacheUsage") -> "CacheUsage":
        return CacheUsage(self.uncached + other.uncached, self.cached + other.cached,
                          self.cache_write + other.cache_write, self.output + other.output,
                          self.cache_write_1h + other.cache_write_1h)


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
        return _openai_usage(_count(usage.get("prompt_tokens")), usage.get("prompt_tokens_details"),
                             _count(usage.get("completion_tokens")))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic
        written = _count(usage.get("cache_creation_input_tokens"))
        hour = min(written, _detail(usage, "cache_creation", "ephemeral_1h_input_tokens"))
        return CacheUsage(_count(usage.get("input_tokens")), _count(usage.get("cache_read_input_tokens")),
                          written, _count(usage.get("output_tokens")), hour)
    # Responses (and Anthropic without cache fields)
    return _openai_usage(_count(usage.get("input_tokens")), usage.get("input_tokens_details"),
                         _count(usage.get("output_tokens")))


def _openai_usage(prompt: int, details, output: int) -> CacheUsage:
    """OpenAI's prompt count holds the cache reads and writes its details report (and
    ``cache_write_1h_tokens``: the gateway's chat-shaped copy of an Anthropic usage's 1-hour
    writes, gateway/messages/stream.chat_usage)."""
    details = details if isinstance(details, dict) else {}
    cached = min(prompt, _count(details.get("cached_tokens")))
    written = min(prompt - cached, _count(details.get("cache_write_tokens")))
    return CacheUsage(prompt - cached - written, cached, written, output,
                      min(written, _count(details.get("cache_write_1h_tokens"))))


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    cache_write: float
    output: float
    cache_write_1h: float | None = None  # a write under the 1-hour TTL (None: as cache_write)

    def cost(self, usage: CacheUsage) -> float:
        hour = self.cache_write if self.cache_write_1h is None else self.cache_write_1h
        return (usage.uncached * self.input + usage.cached * self.cached_input
                + (usage.cache_write - usage.cache_write_1h) * self.cache_write + usage.cache_write_1h * hour
                + usage.output * self.output) / 1e6

    @property
    def cached_rate(self) -> float:
        """A cached input token's price as a share of an uncached one."""
        return self.cached_input / self.input if self.input else 0.1


def _openai(input: float, cached: float, output: float) -> Price:
    return Price(input, cached, input, output)


def _anthropic(input: float, output: float) -> Price:
    return Price(input, round(input * 0.1, 6), round(input * 1.25, 6), output, round(input * 2, 6))





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
    if base is None and "input" not in given:
        return None
    if base is None:
        base = Price(given["input"], given["input"] * 0.1, given["input"], given["input"] * 4)
    elif "cache_write" not in given:
        base = _with_write_premium(base, _family_rule(name))
    return Price(given.get("input", base.input), given.get("cached_input", base.cached_input),
                 given.get("cache_write", base.cache_write), given.get("output", base.output),
                 given.get("cache_write_1h", base.cache_write_1h))


def _with_write_premium(price: Price, rule: "CacheRule | None") -> Price:
    """A family price (e.g. GPT-5's for GPT-5.6) with the write premium its cache rule bills."""
    if rule is None or rule.write <= 1.0 or price.cache_write > price.input:
        return price
    return replace(price, cache_write=round(price.input * rule.write, 6), cache_write_1h=round(price.input * rule.write_1h, 6))


@dataclass(frozen=True, slots=True)
class CacheRule:
    """How a provider caches a model's prompt prefixes (rates are shares of an uncached input token)."""

    min_tokens: int = 1024  # no shorter prefix is cached
    step: int = 128  # cached lengths grow in these steps (1: to the token)
    read: float = 0.1
    write: float = 1.0  # 1.0: writes cost nothing extra
    write_1h: float = 1.0  # a write under the 1-hour TTL
    ttl_s: float = 300.0  # an unused prefix is gone after this long
    breakpoints: str = "implicit"  # "implicit", "cache_control" (Anthropic) or "prompt_cache_breakpoint" (OpenAI)
    max_breakpoints: int = 0  # marks a request may carry (0: none are placed)

    def cacheable(self, tokens: float) -> int:
        """The part of a repeated `tokens`-long prefix the provider serves from its cache."""
        return 0 if tokens < self.min_tokens else int(tokens // self.step * self.step)


# OpenAI before GPT-5.6: implicit, 1,024 tokens up in steps of 128, no write premium, 5-10 minutes.
OPENAI_CACHE = CacheRule()
# GPT-5.6 on: hits to the token, writes at 1.25x, explicit breakpoints, a 30-minute TTL.
OPENAI_BREAKPOINT_CACHE = CacheRule(step=1, write=1.25, write_1h=1.25, ttl_s=1800.0,
                                    breakpoints="prompt_cache_breakpoint", max_breakpoints=4)
ANTHROPIC_CACHE = CacheRule(step=1, write=1.25, write_1h=2.0, breakpoints="cache_control", max_breakpoints=4)
# A name matches its longest prefix here (a provider/ prefix ignored); anything else: OPENAI_CACHE,
# the rule the simulator follows, with the policy's rates.
KNOWN_CACHE_RULES: dict[str, CacheRule] = {
    "gpt-": OPENAI_CACHE, "o1": OPENAI_CACHE, "o3": OPENAI_CACHE, "o4": OPENAI_CACHE,
    **{family: OPENAI_BREAKPOINT_CACHE for family in ("gpt-5.6", "gpt-5.7", "gpt-5.8", "gpt-5.9", "gpt-6", "gpt-7")},
    "claude-": ANTHROPIC_CACHE,
    "claude-3-haiku": CacheRule(min_tokens=2048, step=1, write=1.25, write_1h=2.0, breakpoints="cache_control", max_breakpoints=4),
    "claude-3-5-haiku": CacheRule(min_tokens=2048, step=1, write=1.25, write_1h=2.0, breakpoints="cache_control", max_breakpoints=4),
    "gemini-": CacheRule(min_tokens=4096, step=1),
    "gemini-2.5-flash": CacheRule(min_tokens=2048, step=1),
}


def cache_rule(model: str, price: Price | None = None) -> CacheRule | None:
    """The cache rule of a well-known model family (longest matching prefix), its read and write
    rates taken from `price` when that is known; None for a model nobody listed."""
    rule = _family_rule(model.rsplit("/", 1)[-1].lower())
    if rule is None or price is None or not price.input:
        return rule
    hour = price.cache_write_1h if price.cache_write_1h is not None else price.cache_write
    return replace(rule, read=price.cached_input / price.input, write=price.cache_write / price.input,
                   write_1h=hour / price.input)


def _family_rule(name: str) -> CacheRule | None:
    return next((KNOWN_CACHE_RULES[k] for k in sorted(KNOWN_CACHE_RULES, key=len, reverse=True) if name.startswith(k)), None)
