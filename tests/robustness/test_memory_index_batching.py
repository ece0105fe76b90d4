"""Background indexing batches a busy session's turns into one add (each add is a LanceDB
version and data file held in native memory until the next optimize)."""

from __future__ import annotations

import asyncio

from gateway.jobs.indexer import Indexer
from store.ledger import Ledger, SessionRef
from tests.support.fakes import RecordingIndex


async def three_quick_turns(tmp_path, batch_s: float) -> RecordingIndex:
    ledger = Ledger(tmp_path)
    index = RecordingIndex()
    indexer = Indexer(ledger, lambda: index, batch_s=batch_s)
    ref = SessionRef("t", "busy")
    messages: list[dict] = []
    for turn in range(3):
        messages += [{"role": "user", "content": f"question {turn}"}, {"role": "assistant", "content": f"answer {turn}"}]
        ledger.sync(ref, messages)
        indexer.schedule(ref.key)
        await asyncio.sleep(0.1)  # the next turn comes 0.1 s later
    for _ in range(100):
        if not indexer.bookkeeping()["pending"]:
            break
        await asyncio.sleep(0.05)
    await indexer.close()
    ledger.close()
    return index


async def test_turns_within_the_batch_window_go_into_one_add(tmp_path):
    index = await three_quick_turns(tmp_path, batch_s=0.5)
    assert index.batches == [6]


async def test_without_the_window_every_turn_is_an_add_of_its_own(tmp_path):
    index = await three_quick_turns(tmp_path, batch_s=0.0)
    assert index.batches == [2, 2, 2]
