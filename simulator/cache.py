"""The simulated prompt cache, by OpenAI's rule.

OpenAI caches prompts automatically: a request whose first tokens equal those of an earlier
request (of the same model, within the cache's lifetime) is billed for that shared prefix at
the cached rate, reported as ``usage.prompt_tokens_details.cached_tokens``. Nothing under 1024
tokens is cached, and the cached length grows in steps of 128 tokens. Tools are part of the
prefix and come first: a changed tool list shares nothing.

The cache here works as a provider's does: the prompt is rendered as one token sequence (tools,
then each message's role, name, content and tool calls), cut into blocks of 128 tokens, and
each block is keyed by a hash chained over every block before it. A request is served the
longest run of leading blocks any earlier request stored, so it shares a prefix with *any*
earlier request of the model, not only the previous one, and a message that differs only at
its end still shares its first tokens. The store is bounded (oldest blocks evicted first) and,
when ``ttl_s`` is set, a block unused for that long is gone.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from typing import Any, Callable

import orjson

from simulator.counting import content_text, count_prompt, encode

BLOCK_TOKENS = 128
MIN_CACHED_TOKENS = 1024
MAX_BLOCKS = 400_000  # ~50M tokens of prefixes across models; oldest go first


@functools.lru_cache(maxsize=8192)
def _tokens(rendered: bytes) -> tuple[int, ...]:
    return tuple(encode(rendered.decode()))


def _render_message(message: dict[str, Any]) -> bytes:
    parts = [str(message.get("role", "")), str(message.get("name") or ""),
             content_text(message.get("content"))]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts += [str(function.get("name", "")), str(function.get("arguments", ""))]
    return ("<|m|>" + "\x1f".join(parts)).encode()


def prompt_tokens_sequence(body: dict[str, Any]) -> list[int]:
    """The prompt as the cache sees it: tools (and legacy functions) first, then the messages."""
    sequence: list[int] = []
    for key in ("tools", "functions"):
        if body.get(key):
            sequence += _tokens(orjson.dumps(body[key]))
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            sequence += _tokens(_render_message(message))
    return sequence


class PromptCache:
    """Blocks of earlier prompts per model; ``serve`` answers a request's ``cached_tokens``."""

    def __init__(self, *, ttl_s: float | None = None, max_blocks: int = MAX_BLOCKS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self.clock = clock
        self._blocks: OrderedDict[tuple[str, int], float] = OrderedDict()

    def clear(self) -> None:
        self._blocks.clear()

    def serve(self, model: str, body: dict[str, Any]) -> int:
        """The cached tokens of this request (then its blocks are stored for later ones)."""
        sequence = prompt_tokens_sequence(body)
        now = self.clock()
        keys, chain = [], 0
        for start in range(0, len(sequence) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            chain = hash((chain, tuple(sequence[start:start + BLOCK_TOKENS])))
            keys.append((model, chain))
        hits = 0
        for key in keys:
            seen = self._blocks.get(key)
            if seen is None or (self.ttl_s is not None and now - seen > self.ttl_s):
                break
            hits += 1
        for key in keys:
            self._blocks[key] = now
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        cached = hits * BLOCK_TOKENS
        if cached < MIN_CACHED_TOKENS:
            return 0
        # The rendering's separators are not the counter's per-message overhead: never report
        # more than the prompt the request is billed for, and stay on a 128-token step.
        return min(cached, count_prompt(body) // BLOCK_TOKENS * BLOCK_TOKENS)
