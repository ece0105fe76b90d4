"""Big requests do their CPU work off the event loop, so one huge message cannot freeze the
gateway (and its /healthz) for everyone else.

Below ``BIG_BODY_BYTES`` everything stays inline: a thread hop costs more than parsing,
hashing and counting a normal request (the pass-through overhead is measured in
milliseconds). Above it, three steps move to a worker thread, each unless it is cheap this time:

- ``parse_and_hash``: a format's JSON parsing and the content addresses of the history
  (``path_ids``), unless the body resends one of the tenant's recent bodies but for its tail
  (``history_ids.BODIES``): that parse comes from the memos and runs inline;
- ``build_view``: the whole view build (token counting, projection, compaction, tailoring). When
  the history's token count is remembered but for a few messages (``TokenCounter.count_path``),
  its first half (``ViewBuilder.begin``) runs inline and a view forwarded untouched is done
  there; what is left (planning a changed view) goes to the worker. It runs on a private event
  loop in the worker thread; the builder's collaborators that have
  coroutine methods (window discovery, sync summaries, ...) are bounced back to the gateway's
  loop, which owns their connections, locks and tasks (``OnLoop``);
- the ledger sync (``gateway/pipeline/pipeline.py``, ``sync_history``), unless the embedded
  ledger already holds all but the last few messages (``light_sync``).

The token counter is shared with the gateway's loop, so what the worker counts (the big
message) is cached for the summariser and the next turn.

Background jobs use ``pure``: a pure function over many or big messages (the summary job's
exact-value extraction over a 10,000-message delta takes ~1-2 s) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Mapping
from typing import Any, Callable, TypeVar

from gateway.pipeline.history_ids import BODIES, comparing, history_ids
from gateway.pipeline.request import ChatRequest
from gateway.pipeline.views import View, ViewBuilder
from store.interfaces import StoreBusy
from store.records import SessionRef

T = TypeVar("T")
BIG_BODY_BYTES = 128 * 1024
# A big body that differs from a recent one of its tenant only in this many trailing bytes is
# parsed inline (the parse of the rest comes from the memos, gateway/pipeline/history_ids.py).
RESENT_TAIL_BYTES = 64 * 1024
# A big request whose sync writes at most this many messages syncs inline (``light_sync``).
SYNC_INLINE_NEW = 16
# A message list this long, or with this much text, is worth a thread hop (~0.1 ms).
MANY_MESSAGES = 256


def is_big(raw: bytes) -> bool:
    return len(raw) >= BIG_BODY_BYTES


def is_heavy(messages: list) -> bool:
    """Many messages, or more than BIG_BODY_BYTES of string content (a cheap upper look)."""
    if len(messages) >= MANY_MESSAGES:
        return True
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
        if size >= BIG_BODY_BYTES:
            return True
    return False


async def pure(fn: Callable[..., T], messages: list, /, *args: Any, **kwargs: Any) -> T:
    """`fn(messages, *args, **kwargs)`: inline for a few small messages, else in a worker thread.
    `fn` must be pure (policies/): it shares nothing with the loop but its arguments."""
    if not is_heavy(messages):
        return fn(messages, *args, **kwargs)
    return await asyncio.to_thread(fn, messages, *args, **kwargs)


def parsed_and_hashed(raw: bytes, peer) -> tuple[ChatRequest, list[str]]:
    """A format's parsed request (``peer.parse``) and its history's ids."""
    chat = peer.parse(raw)
    return chat, history_ids(chat.history, len(raw))


async def parse_and_hash(raw: bytes, peer) -> tuple[ChatRequest, list[str]]:
    """``parsed_and_hashed``, in a worker thread when the body is big."""
    if not is_big(raw):
        return parsed_and_hashed(raw, peer)
    # A body that resends one of its tenant's recent bodies but for its tail (an agent's next
    # step) is parsed from the memos in a millisecond or two: inline, as a thread would hold the
    # GIL for as long (it lets the loop in only every switch interval, 5 ms) and add two wake-ups.
    # Within `comparing`, the parse's own byte compare with the tenant's bodies is the one made here.
    with comparing(raw):
        resent = BODIES.resends(raw, RESENT_TAIL_BYTES)
        BODIES.remember(raw)
        if resent:
            return parsed_and_hashed(raw, peer)
    return await asyncio.to_thread(parsed_and_hashed, raw, peer)


def light_sync(ledger, ref: SessionRef, chat: ChatRequest, ids: list[str]) -> bool:
    """Whether syncing a big request into an embedded ledger writes only its last few messages
    (at most ``SYNC_INLINE_NEW``, and not heavy): the ledger already holds the message before
    them, hence, ids being a chain, all of its path. A few indexed reads (the last message new,
    else the last 2, 4, ...); then the sync is worth no thread hop. False for a ledger behind
    the network (its calls go to a thread anyway)."""
    if getattr(ledger, "blocking", False):
        return False
    new = 1
    while new <= SYNC_INLINE_NEW and new < len(ids):  # the last message new, or the last 2, 4, ...
        at = len(ids) - 1 - new
        try:
            if ledger.holds(ref.key, ids[at]):  # an existence check, not a read of the row
                return not is_heavy(chat.history[at + 1:])
        except StoreBusy:  # another process writes: the sync waits for it off the loop
            return False
        new *= 2
    return False


class OnLoop:
    """`target` seen from another thread: its coroutine methods run on `loop` (the one that
    owns their sockets, locks and tasks) and are awaited from the calling thread's loop."""

    def __init__(self, target, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def bounced(*args, **kwargs):
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(attr(*args, **kwargs), self._loop))

        return bounced


async def build_view(views: ViewBuilder, chat: ChatRequest, ref: SessionRef, auth: Mapping[str, str] | None) -> View:
    """`views.build(...)`, on a worker thread when the request is big."""
    if not is_big(chat.raw):
        return await views.build(chat, ref, auth)
    start, _ = views.counter.path_start(chat.ids)
    if is_heavy([*chat.instructions, *chat.history[start:]]):  # much to count: all of it off the loop
        finish = None
    else:
        # The history was counted before (an agent resending it): its estimate is a few look-ups
        # and a count of what it added, so the view is decided here, and a view forwarded
        # untouched (the usual case) costs no thread hop; planning a changed one still does.
        begun = await views.begin(chat, ref, auth)
        if isinstance(begun, View):
            return begun
        finish = begun
    loop = asyncio.get_running_loop()
    worker = views.copy_with(**{name: OnLoop(part, loop) for name, part in vars(views).items() if _has_coroutines(part)})
    work = worker.build(chat, ref, auth) if finish is None else worker.finish(chat, ref, auth, finish)
    return await asyncio.to_thread(asyncio.run, work)


def _has_coroutines(obj) -> bool:
    return _type_has_coroutines(type(obj))


@functools.lru_cache(maxsize=256)
def _type_has_coroutines(kind: type) -> bool:
    """Whether a class has coroutine methods: a walk of its ``dir`` (~0.1 ms), once per class."""
    return any(inspect.iscoroutinefunction(getattr(kind, name, None)) for name in dir(kind) if not name.startswith("__"))
