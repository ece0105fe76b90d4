"""Another process holding the ledger's write lock (a CLI, a second gateway on the same files)
must not freeze the event loop: the write waits in a worker thread while the loop serves
everything else, then lands exactly once."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import aiohttp

import store
from store.interfaces import StoreBusy
from store.ledger import Ledger, SessionRef


def hold_write_lock(path, seconds: float) -> threading.Event:
    """Another connection takes the write lock (BEGIN IMMEDIATE) and keeps it for `seconds`."""
    taken = threading.Event()

    def run() -> None:
        db = sqlite3.connect(str(path), isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        taken.set()
        threading.Event().wait(seconds)
        db.execute("COMMIT")
        db.close()

    threading.Thread(target=run, daemon=True).start()
    taken.wait(5)
    return taken


async def test_locked_write_on_the_loop_waits_off_the_loop(tmp_path):
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    messages = [{"role": "user", "content": "hello"}]
    hold_write_lock(tmp_path / "ledger.sqlite3", 1.0)

    # Called directly on the loop, the ledger refuses to wait there.
    try:
        ledger.sync(ref, messages)
        raise AssertionError("sync on the event loop waited for another process's lock")
    except StoreBusy:
        pass

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    running = asyncio.create_task(ticker())
    synced = await store.call(ledger.sync, ref, messages)
    running.cancel()
    assert synced.added == 1
    # The loop kept running while the write waited (about 1 s of 20 ms ticks).
    assert ticks >= 10
    assert [e.message["content"] for e in ledger.since(ref.key, -1)] == ["hello"]
    ledger.close()


def test_off_the_loop_a_locked_write_waits_for_the_lock(tmp_path):
    """The CLI and worker threads keep SQLite's usual semantics: wait, then write."""
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    hold_write_lock(tmp_path / "ledger.sqlite3", 0.5)
    assert ledger.sync(ref, [{"role": "user", "content": "hi"}]).added == 1
    ledger.close()


async def test_gateway_serves_healthz_while_the_ledger_is_locked(start_gateway, upstream):
    gw = await start_gateway(session={"fallback": "off"})
    ledger_file = gw.settings.store.path + "/ledger.sqlite3"
    async with aiohttp.ClientSession() as http:
        # The store exists once the app started; another writer now holds it for 2 s.
        hold_write_lock(ledger_file, 2.0)
        chat = asyncio.create_task(http.post(
            f"{gw.base_url}/chat/completions",
            json={"model": "fake-32k", "messages": [{"role": "user", "content": "ping"}]},
            headers={"Authorization": "Bearer sk-test", "X-Session-Id": "locked"},
        ))
        await asyncio.sleep(0.2)
        async with http.get(f"{gw.root}/healthz") as health:
            assert health.status == 200
        assert not chat.done()  # still waiting for the lock, yet the loop answered
        response = await chat
        assert response.status == 200
        response.release()
    assert len(upstream.chat_requests()) == 1


async def test_a_write_in_a_worker_thread_does_not_block_the_loops_writes(tmp_path):
    """A big sync runs in a worker thread holding the shared connection: a write from the loop
    meanwhile moves to a thread itself (StoreBusy), so the loop keeps running."""
    ledger = Ledger(tmp_path)
    loop_ran = threading.Event()
    released_by = []

    def big_write() -> None:
        with ledger._transaction():  # the worker's transaction, as a big sync holds it
            released_by.append("loop" if loop_ran.wait(10) else "timeout")

    worker = asyncio.create_task(asyncio.to_thread(big_write))
    await asyncio.sleep(0.05)
    write = asyncio.create_task(store.call(ledger.sync, SessionRef("t", "s"), [{"role": "user", "content": "hi"}]))
    await asyncio.sleep(0.05)  # the loop is free while the worker holds the lock...
    loop_ran.set()  # ...so this runs, and lets the worker finish
    await worker
    synced = await write
    assert released_by == ["loop"] and synced.added == 1
    ledger.close()
