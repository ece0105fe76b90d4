"""The embedded checkpoint store's layout: one row per checkpoint, and the previous layout still reads.

The previous layout kept a session's checkpoints as one diskcache value, ``session_key -> tuple
of dicts``, rewritten whole on every add; stores written that way still read. Sizes, never timings.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import asdict

import diskcache

import store.checkpoints as checkpoints_module
from store.checkpoints import Checkpoint, DiskCheckpoints


def add(store: DiskCheckpoints, session: str, n: int, summary: str = "s" * 2000) -> Checkpoint:
    return store.add(session, boundary=f"ev{n}", summary=f"{summary} {n}", state={"paths": [f"/tmp/{n}"]},
                     covered_tokens=100 * n, covered_events=n, model="m", mode="async", previous=None, summary_tokens=50)


def write_previous_layout(root, session: str, count: int) -> list[Checkpoint]:
    """A store as the previous version wrote it: the session's whole tuple under its key."""
    written = [Checkpoint(f"cp_old{n}", session, f"ev{n}", f"summary {n}", {"n": n}, 10 * n, n, 1_700_000_000.0 + n, "m", n)
               for n in range(1, count + 1)]
    cache = diskcache.Cache(str(root / "checkpoints"), size_limit=2**62, eviction_policy="none")
    cache[session] = tuple(asdict(cp) for cp in written)
    cache.close()
    return written


def test_a_store_of_the_previous_layout_reads_and_grows(tmp_path):
    old = write_previous_layout(tmp_path, "t:old", 3)
    store = DiskCheckpoints(tmp_path)
    try:
        assert store.list("t:old") == old
        assert store.newest_on_path("t:old", {"ev2": 5}) == (old[1], 5)
        new = add(store, "t:old", 4)
        assert new.version == 4
        assert store.list("t:old") == [*old, new]
    finally:
        store.close()
    again = DiskCheckpoints(tmp_path)  # moved to rows by that add: a fresh process reads the same
    try:
        assert again.list("t:old") == [*old, new]
        assert "t:old" not in again._cache  # noqa: SLF001 - the old tuple is gone, not kept beside the rows
        assert again.delete_session("t:old") == 4
        assert again.list("t:old") == []
        assert add(again, "t:old", 1).version == 1
    finally:
        again.close()


def test_a_session_of_the_previous_layout_deletes_without_an_add(tmp_path):
    write_previous_layout(tmp_path, "t:old", 2)
    store = DiskCheckpoints(tmp_path)
    try:
        assert store.delete_session("t:old") == 2
        assert store.list("t:old") == []
    finally:
        store.close()


def test_bytes_written_per_add_do_not_grow_with_the_session(tmp_path, monkeypatch):
    written: list[int] = []
    real_set = diskcache.Cache.set

    def recording_set(self, key, value, *args, **kwargs):
        written.append(len(pickle.dumps(value)))
        return real_set(self, key, value, *args, **kwargs)

    monkeypatch.setattr(diskcache.Cache, "set", recording_set)
    store = DiskCheckpoints(tmp_path)
    try:
        per_add = []
        for n in range(1, 61):
            before = len(written)
            add(store, "t:long", n)
            per_add.append(sum(written[before:]))
        assert per_add[-1] < 1.2 * per_add[0]  # the previous layout wrote ~60x the first add's bytes here
        assert [cp.version for cp in store.list("t:long")] == list(range(1, 61))
        store._memo.clear()  # noqa: SLF001 - read back from disk, not the memo
        assert [cp.boundary for cp in store.list("t:long")] == [f"ev{n}" for n in range(1, 61)]
    finally:
        store.close()


def test_every_thread_gets_the_bounded_sqlite_settings(tmp_path):
    store = DiskCheckpoints(tmp_path)
    seen = {}

    def pragmas(name):
        add(store, f"t:{name}", 1)  # opens this thread's connection
        seen[name] = (store._cache._sql("PRAGMA cache_size").fetchone()[0],  # noqa: SLF001
                      store._cache._sql("PRAGMA mmap_size").fetchone()[0])  # noqa: SLF001

    try:
        pragmas("main")
        worker = threading.Thread(target=pragmas, args=("worker",))
        worker.start()
        worker.join()
        expected = (checkpoints_module.SQLITE_CACHE_PAGES, checkpoints_module.SQLITE_MMAP_BYTES)
        assert seen == {"main": expected, "worker": expected}
        assert expected[0] * 4096 <= 4 * 2**20  # diskcache's default: 8,192 pages (32 MB) per connection
    finally:
        store.close()
