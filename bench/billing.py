"""What the user pays, for the compaction and recall benchmarks.

Billed cost is counted in input-token units by OpenAI's rule: uncached prompt tokens at 1,
cached prompt tokens at ``CACHED_RATE`` (0.1) and completion tokens at 1, summed over every
upstream call the puppet answered (the client's requests, recall rounds, summary calls). The
cached share is what the puppet reported (``simulator/cache.py``: a prefix shared with any
earlier request of the model, at least 1024 tokens, in steps of 128).

``WRITE_RATE`` prices a token written to the cache: 1.0 by default (OpenAI before GPT-5.6 bills
no write), 1.25 for GPT-5.6-style write premiums (``--write-rate 1.25``). A written token is the
part of a prompt's cacheable length (at least 1024 tokens, in steps of 128) that was not read
from the cache; the rest of the uncached prompt is billed at 1.

*Ideal direct* is what the user would pay without the gateway if the window allowed: the
client's own append-only requests, in order, through a fresh cache of the same rule that never
expires, with no window limit, each answered with the answer the client got.
"""

from __future__ import annotations

from typing import Any, Iterable

from simulator.cache import PromptCache
from simulator.counting import count_message, count_prompt, count_text

CACHED_RATE = 0.1
WRITE_RATE = 1.0  # set by the benchmarks' --write-rate


def prompt_cost(prompt: int, cached: int) -> float:
    """A prompt's cost: cached tokens at CACHED_RATE, newly cached ones at WRITE_RATE, the rest at 1."""
    cacheable = 0 if prompt < 1024 else prompt // 128 * 128
    written = max(0, cacheable - cached)
    return prompt - cached - written + WRITE_RATE * written + CACHED_RATE * cached


def usage_cost(usage: dict | None) -> dict[str, float]:
    """One call's usage as billed: uncached, cached and output tokens, and their cost."""
    usage = usage or {}
    prompt = usage.get("prompt_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    output = usage.get("completion_tokens") or 0
    return {"prompt": prompt, "cached": cached, "output": output,
            "cost": prompt_cost(prompt, cached) + output}


def billed(calls: Iterable[Any]) -> dict[str, float]:
    """Sum over the puppet's recorded calls (bench.common.Call); ``summary_*`` are the part of
    the summary calls (x-palimpsest-purpose: summary)."""
    total = {"cost": 0.0, "prompt": 0, "cached": 0, "output": 0,
             "summary_cost": 0.0, "summary_prompt": 0, "summary_cached": 0, "summary_output": 0}
    for call in calls:
        if call.status != 200:
            continue
        c = usage_cost(call.usage)
        for k in ("cost", "prompt", "cached", "output"):
            total[k] += c[k]
            if call.purpose == "summary":
                total["summary_" + k] += c[k]
    return total


def answer_tokens(message: dict | None) -> int:
    """Completion tokens of an answer, counted as the puppet counts them."""
    if not message:
        return 0
    return max(0, count_message(message) - 3 - count_text("assistant"))


def ideal_direct(requests: Iterable[tuple[dict, dict | None]]) -> dict[str, float]:
    """(client body, answer message) pairs of one session, in order, through a perfect cache."""
    cache = PromptCache()
    total = {"cost": 0.0, "prompt": 0, "cached": 0, "output": 0}
    for body, answer in requests:
        prompt = count_prompt(body)
        cached = min(cache.serve(body.get("model", ""), body), prompt)
        output = answer_tokens(answer)
        total["prompt"] += prompt
        total["cached"] += cached
        total["output"] += output
        total["cost"] += prompt_cost(prompt, cached) + output
    return total


def add(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v
    return into
