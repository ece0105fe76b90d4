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

``ListMemo`` remembers, the same way, a format's big bodies and what its parser made of their
input list (the neutral items, and that they passed the declared shape), compared as the
bodies' bytes: the resent part of a list is neither parsed, checked nor converted again, and
comes back as the same neutral objects, whose ids the memo above then finds by identity.

Both memos are per tenant (``MEMO_SCOPE``, set by the tenant gate, gateway/http/gate.py): one
tenant's requests never find, or time, another tenant's entries. Code that parses outside a
request (tests, tools) shares the scope "".
"""

from __future__ import annotations

import bisect
import json
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from itertools import compress, count, islice
from operator import is_not
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson

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
            # The leading run of the very same objects (a resent list from ``ListMemo``) found in
            # C, then equal ones compared as before (a body parsed whole).
            same = next(compress(count(), map(is_not, history, before)), min(len(history), len(before)))
            for new, old in zip(islice(history, same, None), islice(before, same, None)):
                if new != old:
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


# A JSON string (escapes included) or a bracket: enough to find where a list's elements end
# in text that orjson has parsed (or will parse) whole.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]]', re.S)
_WS = b" \t\r\n"
_OPEN, _QUOTE = frozenset(b"{["), ord('"')


def _objects(raw: bytes, at: int, ends: list[int]) -> int | None:
    """From `at` (inside a JSON list, after its '[' or after one of its elements), append where
    each following element ends (just after its '}') to `ends`; the position of the list's
    closing ']'. None when an element is a string (a number or literal is not seen at all:
    callers compare the count with the parsed list's length)."""
    depth = 0
    for token in _TOKEN.finditer(raw, at):
        first = raw[token.start()]
        if first == _QUOTE:
            if not depth:
                return None
        elif first in _OPEN:
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                return token.start()
            if not depth:
                ends.append(token.end())
    return None


def _python_dumps(item) -> bytes:
    return json.dumps(item).encode()


# How clients write JSON, tried in turn: (write one element, the separator between elements).
# orjson's compact form is serde_json's, httpx's and orjson's; Python's json.dumps default
# (", " and ": ", non-ASCII escaped) is the OpenAI SDK's over older httpx versions.
_WRITERS = ((orjson.dumps, b","), (_python_dumps, b", "))


def _written_ends(raw: bytes, at: int, value: list) -> list[int] | None:
    """Where each element of the list starting at `at` ends, when the list is written as one of
    ``_WRITERS`` writes it: each element written once and compared in place (C-level work,
    where a scan of the text is Python's). None when neither writes it so."""
    for write, sep in _WRITERS:
        ends, offset = [], at
        for i, item in enumerate(value):
            piece = write(item)
            if not raw.startswith(piece, offset):
                break
            offset += len(piece)
            ends.append(offset)
            closing = sep if i + 1 < len(value) else b"]"
            if not raw.startswith(closing, offset):
                break
            offset += len(closing)
        else:
            return ends
    return None


def _key_list(raw: bytes, key: bytes, at: int = 0, depth: int = 0) -> int | None:
    """Just after the '[' of the list the top-level `key` (its JSON, quotes included) names,
    scanning from `at` at nesting `depth`; None when there is none."""
    for token in _TOKEN.finditer(raw, at):
        first = raw[token.start()]
        if first == _QUOTE:
            if depth == 1 and token.group() == key:
                rest = raw[token.end():token.end() + 64].lstrip(_WS)
                if rest[:1] == b":" and rest[1:].lstrip(_WS)[:1] == b"[":
                    return raw.index(b"[", token.end()) + 1
        elif first in _OPEN:
            depth += 1
        else:
            depth -= 1
    return None


@dataclass(eq=False)
class Splice:
    """A body parsed from a remembered one: the parse, how many leading elements of its list
    were taken from the remembered parse (byte for byte the same), what the format's parser
    kept of that parse (`state`), and where each element of this body's list ends."""

    body: dict
    same: int
    state: Any
    ends: list[int]
    entry: Any = None


class ListMemo:
    """The last big bodies of each tenant (``MEMO_SCOPE``) whose top-level `key` is a list of
    objects, so that the next step of a conversation, which resends one of them but for its
    end, is not parsed again whole: the longest remembered prefix of the new body's bytes is
    found, the list's elements wholly inside it are taken from the remembered parse (the same
    objects: nobody changes them), and only the rest is parsed (``orjson`` on the new elements
    and on the fields after the list). The result is exactly what ``orjson.loads`` of the whole
    body gives; anything unusual (a key twice, an element that is not an object, no shared
    element) is parsed whole. Each entry also keeps what the format's parser made of the list
    (its ``state``, never changed by anyone), reused for the same leading elements. The byte
    budget counts the bodies; least recently used tenant out first."""

    def __init__(self, key: str = "input", *, min_bytes: int = MEMO_MIN_BYTES, budget_bytes: int = MEMO_BUDGET_BYTES,
                 per_scope: int = 8) -> None:
        self.key = key
        self._quoted = orjson.dumps(key)
        self.min_bytes = min_bytes
        self.budget_bytes = budget_bytes
        self.per_scope = per_scope
        self._lock = threading.Lock()
        # scope -> entries, newest first: (raw, where the list starts, where its elements end, body, state)
        self._recent: OrderedDict[str, list[tuple[bytes, int, list[int], dict, Any]]] = OrderedDict()
        self._bytes = 0
        self.reused = 0  # elements found in the memo (tests and benchmarks read it)

    def parse(self, raw: bytes) -> Splice | None:
        """`raw` spliced onto the remembered body it shares the most leading elements with;
        None when none shares one (the caller parses it whole)."""
        scope = MEMO_SCOPE.get()
        with self._lock:
            entries = list(self._recent.get(scope, ()))
            if entries:
                self._recent.move_to_end(scope)
        best, common = None, 0
        for entry in entries:
            n = common_prefix(raw, entry[0])
            if n > common:
                best, common = entry, n
        if best is None:
            return None
        _, _, ends, body, state = best
        same = bisect.bisect_right(ends, common)
        if not same:
            return None
        try:
            return self._splice(raw, best, same)
        except orjson.JSONDecodeError:
            return None  # parsed whole: its own error, at its own place

    def _splice(self, raw: bytes, entry, same: int) -> Splice | None:
        _, _, ends, before, state = entry
        ends = ends[:same]
        close = _objects(raw, ends[-1], ends)
        if close is None:
            return None
        tail = raw[ends[same - 1]:close].strip(_WS)
        new: list = []
        if tail:
            if tail[:1] != b"," or tail[1:].lstrip(_WS)[:1] != b"{":
                return None
            new = orjson.loads(b"[" + tail[1:] + b"]")
        rest = raw[close + 1:].lstrip(_WS)
        if rest[:1] == b",":
            if rest[1:].lstrip(_WS)[:1] != b'"':
                return None
            after = orjson.loads(b"{" + rest[1:])
        elif rest[:1] == b"}" and not rest[1:].strip(_WS):
            after = {}
        else:
            return None
        if len(new) != len(ends) - same or not all(type(item) is dict for item in new):
            return None
        body: dict = {}
        for name, value in before.items():
            if name == self.key:
                break
            body[name] = value
        if self.key in after or not body.keys().isdisjoint(after):
            return None  # a key twice: parsed whole, whose last value wins
        body[self.key] = [*before[self.key][:same], *new]
        body.update(after)
        with self._lock:
            self.reused += same
        return Splice(body, same, state, ends, entry)

    def remember(self, raw: bytes, body: dict, state: Any, spliced: Splice | None = None) -> None:
        """`raw` (parsed as `body`, through `spliced` when it was) and the parser's `state`; a body
        whose list is not found, or not only objects, is not remembered."""
        if len(raw) > self.budget_bytes:
            return
        value = body.get(self.key)
        if not isinstance(value, list):
            return
        if spliced is not None:
            ends, at = spliced.ends, spliced.entry[1]
        else:
            at = _key_list(raw, self._quoted)
            if at is None or not all(type(item) is dict for item in value):
                return
            ends = _written_ends(raw, at, value) if value else None
            if ends is None:  # written some other way: scanned
                ends = []
                close = _objects(raw, at, ends)
            else:
                close = ends[-1]
            if close is None or len(ends) != len(value) or _key_list(raw, self._quoted, close + 1, 1) is not None:
                return
        scope = MEMO_SCOPE.get()
        with self._lock:
            entries = self._recent.setdefault(scope, [])
            self._recent.move_to_end(scope)
            if spliced is not None and spliced.entry in entries:  # the conversation's next step replaces its last
                entries.remove(spliced.entry)
                self._bytes -= len(spliced.entry[0])
            # The list copied: a later change to this request's list leaves the memo as it was.
            entries.insert(0, (raw, at, ends, {**body, self.key: list(value)}, state))
            self._bytes += len(raw)
            while len(entries) > self.per_scope:
                self._bytes -= len(entries.pop()[0])
            while self._bytes > self.budget_bytes and self._recent:
                oldest = next(iter(self._recent.values()))
                self._bytes -= len(oldest.pop()[0])
                if not oldest:
                    self._recent.popitem(last=False)


_CHUNK = 64 * 1024
# While a big body is parsed inline (``comparing``): that body and the prefix lengths measured
# against it, {id(other): (other, length)}. Where it is parsed (``BODIES.resends``) and the parse
# itself (``ListMemo.parse``) compare it with the same remembered bytes objects; the second asks
# here instead of comparing ~500 KB again. Keyed by identity, the objects held: no stale length.
_PREFIXES = threading.local()


@contextmanager
def comparing(raw: bytes):
    """Within: `common_prefix(raw, other)` on this thread is measured once per `other`."""
    _PREFIXES.memo = (raw, {})
    try:
        yield
    finally:
        _PREFIXES.memo = None  # the body is not held past its parse


def common_prefix(raw: bytes, other: bytes) -> int:
    """``_common_prefix(raw, other)``, remembered while ``comparing(raw)``."""
    memo = getattr(_PREFIXES, "memo", None)
    if memo is None or memo[0] is not raw:
        return _common_prefix(raw, other)
    hit = memo[1].get(id(other))
    if hit is not None and hit[0] is other:
        return hit[1]
    n = _common_prefix(raw, other)
    memo[1][id(other)] = (other, n)
    return n


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
        return any(len(raw) - common_prefix(raw, body) <= new_bytes for body in bodies)

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
