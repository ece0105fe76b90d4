"""What the gateway keeps per session stays bounded however many sessions come and go (the load
benchmark's RSS growth after warm-up stays <= 10%). Sizes are asserted after many sessions, never timings."""

from __future__ import annotations

import asyncio
import gc

import pytest

import store.index as index_module
from gateway.jobs.indexer import Indexer
from store.embedders import HashingEmbedder
from store.index import IndexedEvent, SearchIndex
from store.ledger import Event


def events(session: int, start: int, count: int) -> list[IndexedEvent]:
    return [IndexedEvent(f"s{session}-e{seq}", seq, "user", 1_700_000_000.0 + seq,
                         f"session {session} note {seq}: the parcel code is P{session}X{seq}") for seq in range(start, start + count)]


@pytest.fixture
def small_bounds(monkeypatch):
    monkeypatch.setattr(index_module, "OPEN_TABLES", 6)
    monkeypatch.setattr(index_module, "HIGH_WATER_TRACKED", 10)


async def test_search_index_keeps_bounded_state_over_many_sessions(tmp_path, small_bounds):
    index = SearchIndex(str(tmp_path / "index"), HashingEmbedder(), cache_bytes=4 * 2**20)
    try:
        for session in range(40):
            await index.add(f"t:s{session}", events(session, 0, 3))
            assert await index.search(f"t:s{session}", f"parcel code P{session}X1", 3)
        # Several adds racing on one session still share one lock.
        await asyncio.gather(*(index.add("t:s0", events(0, 3 + 2 * i, 2)) for i in range(5)))
        gc.collect()
        kept = index.bookkeeping()
        assert kept["open_tables"] <= 6
        assert kept["high_water"] <= 10
        assert kept["locks"] == 0  # nobody holds or awaits a lock now
        # Forgotten state is read back correctly: session 1's table was closed and its mark dropped.
        assert index.indexed_seq("t:s1") == 2
        hits = await index.search("t:s1", "parcel code P1X2", 3)
        assert hits and hits[0].event_id == "s1-e2"
        assert index.indexed_seq("t:s0") == 12
        assert await index.add("t:s0", events(0, 0, 13)) == 0  # nothing indexed twice
    finally:
        index.close()


async def test_lance_caches_are_bounded_by_cache_bytes(tmp_path):
    bound = 2 * 2**20
    index = SearchIndex(str(tmp_path / "index"), HashingEmbedder(), cache_bytes=bound)
    try:
        for step in range(40):  # appends make table versions, and optimize() new FTS index versions
            for session in range(4):
                await index.add(f"t:s{session}", events(session, 2 * step, 2))
                await index.search(f"t:s{session}", f"note {2 * step}", 3)
        assert 0 < index.bookkeeping()["cache_bytes"] <= 1.5 * bound
    finally:
        index.close()


class _Ledger:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def since(self, session_key: str, seq: int) -> list[Event]:
        self.calls.append(session_key)
        return [Event(f"{session_key}-e1", None, 1, "user", {"role": "user", "content": "hello"}, 1.0)]


class _Index:
    def __init__(self) -> None:
        self.inside: set[str] = set()
        self.overlaps = 0
        self.release = asyncio.Event()

    def indexed_seq(self, session_key: str) -> int:
        return -1

    async def add(self, session_key: str, batch: list) -> int:
        if session_key in self.inside:
            self.overlaps += 1
        self.inside.add(session_key)
        await self.release.wait()
        self.inside.discard(session_key)
        return len(batch)


async def test_indexer_locks_live_only_while_a_catch_up_runs():
    ledger, index = _Ledger(), _Index()
    indexer = Indexer(ledger, lambda: index)  # type: ignore[arg-type]
    index.release.set()
    for session in range(300):
        assert await indexer.catch_up(f"t:s{session}") == 1
    gc.collect()
    assert indexer.bookkeeping() == {"locks": 0, "pending": 0}

    # Two catch-ups of one session still exclude each other while they run.
    index.release.clear()
    first = asyncio.create_task(indexer.catch_up("t:same"))
    second = asyncio.create_task(indexer.catch_up("t:same"))
    await asyncio.sleep(0.05)
    assert indexer.bookkeeping()["locks"] == 1
    index.release.set()
    await asyncio.gather(first, second)
    assert index.overlaps == 0
    gc.collect()
    assert indexer.bookkeeping()["locks"] == 0


def test_checkpoint_memo_keeps_a_bounded_number_of_sessions(tmp_path, monkeypatch):
    import store.checkpoints as checkpoints_module
    from store.checkpoints import DiskCheckpoints

    monkeypatch.setattr(checkpoints_module, "MEMO_SESSIONS", 5)
    store = DiskCheckpoints(tmp_path / "cp")
    try:
        for session in range(30):
            for n in range(2):
                store.add(f"t:s{session}", boundary=f"b{n}", summary="x" * 1000, state={}, covered_tokens=1, covered_events=n + 1,
                          model="m", mode="async", previous=None, summary_tokens=1)
            assert len(store.list(f"t:s{session}")) == 2
        assert len(store._memo) <= 5  # noqa: SLF001 - the bound is the behaviour under test
        assert [cp.boundary for cp in store.list("t:s0")] == ["b0", "b1"]  # read back after eviction
    finally:
        store.close()
