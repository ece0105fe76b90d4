"""Content addresses of a request's history, reusing what the previous big request hashed.

An agent resends its whole history on every step, and a Codex or Claude Code session soon sends
hundreds of KB. Hashing every message again (``store.canonical.path_ids``: a canonical form,
its JSON and a blake2b per message) was the largest part of what the gateway added to such a
request. The ids are a chain, so a history whose first k messages equal the first k of a
history hashed before has the same first k ids: comparing the parsed messages (a C-level
deep ``==``) costs a fraction of hashing them.

Only big bodies are remembered (small ones hash faster than they would be looked up), keyed
by their first message's id, within a byte budget (least recently used out first). The memo
holds the parsed histories it compares against; equal messages give equal ids, so it can
neither leak nor mix anything between sessions or tenants: it returns exactly the ids
``path_ids`` would. Requests are parsed in worker threads, hence the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from store.canonical import event_id

# Bodies below this size are hashed from scratch (gateway/pipeline/offload.py's threshold).
MEMO_MIN_BYTES = 128 * 1024
# What the remembered histories weigh, counted as the sizes of the bodies they came from.
MEMO_BUDGET_BYTES = 64 * 1024 * 1024


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
        with self._lock:
            known = self._recent.get(first)
            if known is not None:
                self._recent.move_to_end(first)
        same = 0
        if known is not None:
            before, before_ids, _ = known
            for new, old in zip(history, before):
                if new != old:
                    break
                same += 1
        ids = _chain(before_ids[:same] if same else [first], history, max(same, 1))
        with self._lock:
            self.reused += same
            old = self._recent.pop(first, None)
            if old is not None:
                self._bytes -= old[2]
            if size <= self.budget_bytes:
                self._recent[first] = (history, ids, size)
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


HISTORY_IDS = HistoryIds()  # one per process, shared by the three formats' parsers


def history_ids(history: list[dict], size: int) -> list[str]:
    return HISTORY_IDS.ids(history, size)
