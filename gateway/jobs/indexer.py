"""Keeps the recall index a caught-up, derived cache of the ledger (docs/architecture.md, Recall)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Callable

from policies.messages import call_arguments, call_name, content_text, tool_calls
from store.interfaces import LedgerStore
from store.records import Event

if TYPE_CHECKING:
    from store.index import SearchIndex

log = logging.getLogger("palimpsest.indexer")

# Events handed to the index per add: chunking, Arrow conversion and the known-id query of a
# batch run on the event loop, so a 10,000-message catch-up goes in slices with the loop free
# between them (no stall of the loop over 1 s).
BATCH_EVENTS = 256


def event_text(event: Event) -> str:
    """What the index and session_load show of an event: its text and any tool calls."""
    message = event.message
    parts = [content_text(message.get("content"))]
    for call in tool_calls(message):
        parts.append(f"[called {call_name(call)}({call_arguments(call)})]")
    return "\n".join(p for p in parts if p)


class Indexer:
    """Keeps the search index caught up with the ledger: in the background after each turn,
    and always before a search (a search sees every durable event of its session).

    The index is opened on first use: LanceDB, Arrow and the embedder cost ~100 MB of memory,
    which a gateway whose sessions never hide anything should not pay."""

    def __init__(self, ledger: LedgerStore, open_index: Callable[[], "SearchIndex"], batch_s: float = 0.0) -> None:
        self.ledger = ledger
        self._open_index = open_index
        # A background catch-up waits this long first: the session's turns meanwhile join its
        # add instead of each making a LanceDB version of their own (schedule() keeps one).
        self.batch_s = batch_s
        self._index: "SearchIndex | None" = None
        self._open_lock = asyncio.Lock()
        # Weak: a session's lock lives while a catch-up holds or awaits it, so sessions that
        # come and go over the process's life leave nothing behind.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._pending: dict[str, asyncio.Task] = {}

    async def opened(self) -> "SearchIndex":
        """The index, opened on first call in a worker thread: importing LanceDB takes ~2 s
        of CPU that must not freeze the event loop (and every request on it)."""
        if self._index is None:
            async with self._open_lock:
                if self._index is None:
                    self._index = await asyncio.to_thread(self._open_index)
        return self._index

    async def catch_up(self, session_key: str) -> int:
        lock = self._locks.get(session_key)
        if lock is None:
            lock = self._locks[session_key] = asyncio.Lock()
        index = await self.opened()
        from store.index import IndexedEvent  # after opened(): LanceDB is imported off the loop

        async with lock:
            seq = index.indexed_seq(session_key)
            # Reading and decoding what is new (10,000 events: ~0.3 s of CPU) happens off the loop.
            batch = await asyncio.to_thread(self._unindexed, session_key, seq, IndexedEvent)
            added = 0
            for start in range(0, len(batch), BATCH_EVENTS):
                added += await index.add(session_key, batch[start : start + BATCH_EVENTS])
            return added

    def _unindexed(self, session_key: str, seq: int, indexed_event) -> list:
        """The session's message events after `seq`, as index rows (runs in a worker thread)."""
        events = self.ledger.since(session_key, seq)
        return [indexed_event(e.id, e.seq, e.role, e.created, event_text(e), e.parent or "") for e in events if e.kind == "message"]

    def bookkeeping(self) -> dict[str, int]:
        """Sizes of what is kept per session (all bounded by the sessions in flight)."""
        return {"locks": len(self._locks), "pending": len(self._pending)}

    def schedule(self, session_key: str) -> None:
        if session_key in self._pending:
            return
        task = asyncio.create_task(self._background(session_key))
        self._pending[session_key] = task
        task.add_done_callback(lambda _t: self._pending.pop(session_key, None))

    async def _background(self, session_key: str) -> None:
        try:
            if self.batch_s > 0:
                await asyncio.sleep(self.batch_s)
            await self.catch_up(session_key)
        except Exception:
            log.exception("background indexing failed")

    async def close(self) -> None:
        tasks = list(self._pending.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._index is not None:
            self._index.close()
