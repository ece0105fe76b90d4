"""The recall index optimises at most MAINTAIN_CONCURRENTLY sessions at once.

Each optimize() rewrites a session's fragments and merges its FTS index in native memory. Under
bench/load.py all 20 sessions crossed the threshold within seconds and optimised together, over
and over; bounded, the others wait their turn (one pending task per session) and still run.
"""

from __future__ import annotations

import asyncio

import lancedb.table

import store.index as index_module
from store.embedders import HashingEmbedder
from store.index import IndexedEvent, SearchIndex


def events(session: int, start: int, count: int) -> list[IndexedEvent]:
    return [IndexedEvent(f"s{session}-e{seq}", seq, "user", 1_700_000_000.0 + seq,
                         f"session {session} note {seq}: the parcel code is P{session}X{seq}") for seq in range(start, start + count)]


async def test_optimize_runs_for_a_bounded_number_of_sessions_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(index_module, "MAINTAIN_AFTER_ADDS", 2)
    running, most, optimised = [0], [0], []
    real = lancedb.table.AsyncTable.optimize

    async def optimize(self, *args, **kwargs):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            await asyncio.sleep(0.05)  # long enough for every other session's task to start waiting
            result = await real(self, *args, **kwargs)
            optimised.append(self.name)
            return result
        finally:
            running[0] -= 1

    monkeypatch.setattr(lancedb.table.AsyncTable, "optimize", optimize)
    index = SearchIndex(str(tmp_path / "index"), HashingEmbedder(), cache_bytes=4 * 2**20)
    try:
        sessions = 8
        for session in range(sessions):
            await index.add(f"t:s{session}", events(session, 0, 2))  # creates the table
        for round_ in range(2):  # two more adds each: every session crosses the threshold
            await asyncio.gather(*(index.add(f"t:s{session}", events(session, 2 + 2 * round_, 2)) for session in range(sessions)))
        assert len(index.bookkeeping()) and index.bookkeeping()["maintenance"] >= sessions - index_module.MAINTAIN_CONCURRENTLY
        for _ in range(400):
            if not index.bookkeeping()["maintenance"]:
                break
            await asyncio.sleep(0.05)
        assert index.bookkeeping()["maintenance"] == 0
        assert len(set(optimised)) == sessions  # every session got its turn
        assert most[0] == index_module.MAINTAIN_CONCURRENTLY
        for session in range(sessions):  # and the index still answers
            assert await index.search(f"t:s{session}", f"parcel code P{session}X3", 3)
    finally:
        index.close()
