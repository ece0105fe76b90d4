"""Values folded over a conversation path, remembered by content address.

A path's ids are content addresses of the whole path up to each message
(``store.canonical.path_ids``: each id hashes its parent's id and its message), so a value
folded over a path's leading part can be kept under the id of its last message and is valid for
any later path through that id. ``PathMemo`` keeps the folded value at a path's end and at every
``stride``-th message, and at the message before the end (where a regenerated or edited last
message branches off): a request that resends a known path (an agent's next step, or another
branch off the same history) folds only the messages after the longest remembered leading part,
O(new messages) instead of a walk over the whole history. An edited message gives every later
message a new id, so the path is folded afresh from the edit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable


class PathMemo:
    """Folded values by path id, bounded (least recently used first out) and thread-safe."""

    def __init__(self, *, stride: int = 32, look_back: int = 64) -> None:
        self.stride = stride  # a value is kept every `stride` messages of a path (shared history)
        self.look_back = look_back  # how far back from a path's end an earlier path's end is looked for
        self._kept: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()  # views are built in worker threads too

    def __len__(self) -> int:
        return len(self._kept)

    def start(self, ids: list[str]) -> tuple[int, Any]:
        """(how many leading messages of the path are folded already, their value): the longest
        leading part remembered, an earlier path's end near this one's, else a kept stride;
        (0, None) when none is."""
        n = len(ids)
        with self._lock:
            ends = range(n, max(0, n - self.look_back), -1)
            strides = range((n // self.stride) * self.stride, 0, -self.stride)
            for end in (*ends, *strides):
                found = self._kept.get(ids[end - 1])
                if found is not None:
                    self._kept.move_to_end(ids[end - 1])
                    return end, found
        return 0, None

    def fold(self, ids: list[str], walk: Callable[[Any, int, int], Any], initial: Any, *, keep: int) -> Any:
        """The value of the whole path: ``walk(value, start, stop)`` folds messages
        ``[start, stop)`` into the value, called from the longest remembered leading part a
        stride at a time; the value at each stride, before the path's last message and at its
        end is kept, at most `keep` values in all."""
        n = len(ids)
        at, value = self.start(ids)
        if not at:
            value = initial
        kept: list[tuple[str, Any]] = []
        while at < n:
            stop = min(n, (at // self.stride + 1) * self.stride)
            if at < n - 1 < stop:
                stop = n - 1  # kept too: a sibling of the last message (regenerated, edited) folds one message
            value = walk(value, at, stop)
            kept.append((ids[stop - 1], value))
            at = stop
        if kept:
            with self._lock:
                for key, folded in kept:
                    self._kept[key] = folded
                    self._kept.move_to_end(key)
                while len(self._kept) > keep:
                    self._kept.popitem(last=False)
        return value
