"""Content addresses of a request's history, reusing what the previous big request hashed.

An agent resends its whole history on every step, and a Codex or Claude Code session soon sends
hundreds of KB. Hashing every message again (``store.canonical.path_ids``: a canonical form,
its JSON and a blake2b per message) was the largest part of what the gateway added to such a
request. The ids are a chain, so a history whose first k messages equal the first k of a
history hashed before has the same first k ids: comparing the parsed messages (a C-level
deep ``==``) costs a fraction of hashing them.

Only big bodies are remembered (small ones hash faster than they would be looked up), keyed
by the tenant and their first message's id, within a byte budget (least recently used out
first). The memo holds the parsed histories it compares against; equal messages give equal
ids, so it cannot mix anything between sessions: it returns exactly the ids ``path_ids``
would. Requests are parsed in worker threads, hence the lock.

``ListMemo`` remembers, the same way, what a format's parser made of an input list (the
neutral items, and that they passed the declared shape), compared as JSON bytes: the resent part of a list is neither checked nor converted again, and comes back as the
same neutral objects, whose ids the memo above then finds by identity.

Both memos are per tenant (``MEMO_SCOPE``, set by the tenant gate, gateway/http/gate.py): one
tenant's requests never find, or time, another tenant's entries. Code that parses outside a
request (tests, tools) shares the scope "".
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any

from store.canonical import event_id

# Bodies below this size are hashed from scratch (gateway/pipeline/offload.py's threshold).
MEMO_MIN_BYTES = 128 * 1024
# What the remembered histories weigh, counted as the sizes of the bodies they came from.
MEMO_BUDGET_BYTES = 64 * 1024 * 1024

# The tenant whose request this task serves (gateway/http/gate.py sets it around the handler;
# worker threads inherit it: asyncio.to_thread copies the context).
MEMO_SCOPE: ContextVar[str] = ContextVar("palimpsest_memo_scope", default="")


class HistoryIds:
    def __init__(self, *, min_bytes: int = MEMO_MIN_BYTES, budget_bytes: int = MEMO_BUDGET_BYTES) -> None:
        self.min_bytes = min_bytes
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, tuple[list[dict], list[str], int]] = OrderedDict()
        self._bytes = 0
        self.reused = 0  # messages whose ids came from the memo (tests and benchmarks read it)

    def ids(self, history: list[dict], size: int) -> list[str]:
        """``path_ids(history)`` for a request body of `size` bytes."""
        if not history:
            return []
        first = event_id(None, history[0])
        if size < self.min_bytes:
            return _chain([first], history, 1)
        key = (MEMO_SCOPE.get(), first)
        with self._lock:
            known = self._recent.get(key)
            if known is not None:
                self._recent.move_to_end(key)
        same = 0
        if known is not None:
            before, before_ids, _ = known
            for new, old in zip(history, before):
                if new is not old and new != old:
                    break
                same += 1
        ids = _chain(before_ids[:same] if same else [first], history, max(same, 1))
        with self._lock:
            self.reused += same
            old = self._recent.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            if size <= self.budget_bytes:
                self._recent[key] = (history, ids, size)
                self._bytes += size
            while self._bytes > self.budget_bytes and self._recent:
                _, (_, _, dropped) = self._recent.popitem(last=False)
                self._bytes -= dropped
        return ids


def _chain(ids: list[str], history: list[dict], start: int) -> list[str]:
    ids = list(ids)
    parent = ids[-1]
    for message in history[start:]:
        parent = event_id(parent, message)
        ids.append(parent)
    return ids


class ListMemo:
    """What a parser made of the JSON list it saw last for a conversation, reused for the part a
    new request resends byte for byte. Keyed by (tenant, the list's first element as JSON);
    each entry is the list as JSON (``orjson.dumps``: key order and number types kept), where
    each element ends in it, and what the parser kept (its ``state``, never changed by anyone:
    the parsed items in it are shared by every request that resends them). The byte budget
    counts the request bodies; least recently used out first."""

    def __init__(self, *, min_bytes: int = MEMO_MIN_BYTES, budget_bytes: int = MEMO_BUDGET_BYTES) -> None:
        self.min_bytes = min_bytes
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._recent: OrderedDict[tuple[str, bytes], tuple[bytes, list[int], Any, int]] = OrderedDict()
        self._bytes = 0
        self.reused = 0  # elements found in the memo (tests and benchmarks read it)

    def lookup(self, first: bytes, blob: bytes) -> tuple[int, list[int], Any]:
        """(how many leading elements of the list `blob` are those of the remembered list, where
        they end in `blob`, the remembered state); (0, [], None) when none is."""
        key = (MEMO_SCOPE.get(), first)
        with self._lock:
            known = self._recent.get(key)
            if known is not None:
                self._recent.move_to_end(key)
        if known is None:
            return 0, [], None
        before, ends, state, _ = known
        common = _common_prefix(blob, before)
        # Element j is the same when its JSON and the separator after it are: a value's end is
        # then where it was (a number's last digit is not taken for its end).
        same = bisect.bisect_left(ends, common)
        with self._lock:
            self.reused += same
        return same, ends[:same], state

    def remember(self, first: bytes, blob: bytes, ends: list[int], state: Any, size: int) -> None:
        key = (MEMO_SCOPE.get(), first)
        with self._lock:
            old = self._recent.pop(key, None)
            if old is not None:
                self._bytes -= old[3]
            if size <= self.budget_bytes:
                self._recent[key] = (blob, ends, state, size)
                self._bytes += size
            while self._bytes > self.budget_bytes and self._recent:
                _, (_, _, _, dropped) = self._recent.popitem(last=False)
                self._bytes -= dropped


_CHUNK = 64 * 1024


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of two byte strings: memcmp of chunks, then of
    halving runs inside the first chunk that differs. ``a.startswith(view, at)`` compares
    ``a[at:]`` with a memoryview of `b` in place: no slice is copied (a copy of every chunk
    cost ~0.3 ms on a 500 KB body)."""
    n = min(len(a), len(b))
    view = memoryview(b)
    at = 0
    while at < n:
        end = min(at + _CHUNK, n)
        if not a.startswith(view[at:end], at):
            lo, hi = at, end  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a.startswith(view[lo:mid], lo):
                    lo = mid
                else:
                    hi = mid
            return lo
        at = end
    return n


class RecentBodies:
    """The last few big request bodies of each tenant (``MEMO_SCOPE``), to tell a body that
    resends one of them but for its last bytes (an agent's next step) from one that is new: the
    first is parsed from the memos above in a millisecond or two and costs no thread hop
    (gateway/pipeline/offload.py); the second is worth one. Only where the parse runs depends
    on it, never what the parse gives. Within a byte budget, least recently used tenant out first."""

    def __init__(self, *, per_scope: int = 8, budget_bytes: int = MEMO_BUDGET_BYTES // 2) -> None:
        self.per_scope = per_scope
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, list[bytes]] = OrderedDict()
        self._bytes = 0

    def resends(self, raw: bytes, new_bytes: int) -> bool:
        """Whether `raw` equals one of its tenant's recent bodies but for at most its last `new_bytes`."""
        with self._lock:
            bodies = list(self._recent.get(MEMO_SCOPE.get(), ()))
        return any(len(raw) - _common_prefix(raw, body) <= new_bytes for body in bodies)

    def remember(self, raw: bytes) -> None:
        if len(raw) > self.budget_bytes:
            return
        scope = MEMO_SCOPE.get()
        with self._lock:
            bodies = self._recent.setdefault(scope, [])
            self._recent.move_to_end(scope)
            bodies.insert(0, raw)
            self._bytes += len(raw)
            while len(bodies) > self.per_scope:
                self._bytes -= len(bodies.pop())
            while self._bytes > self.budget_bytes and self._recent:
                _, dropped = self._recent.popitem(last=False)
                self._bytes -= sum(len(body) for body in dropped)


HISTORY_IDS = HistoryIds()  # one per process, shared by the three formats' parsers
INPUTS = ListMemo()  # the same, for a format's parser of its input list (gateway/responses/adapter.py)
BODIES = RecentBodies()  # where a big body is parsed (gateway/pipeline/offload.py)


def history_ids(history: list[dict], size: int) -> list[str]:
    return HISTORY_IDS.ids(history, size)
