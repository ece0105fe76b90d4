"""The embedded checkpoint store: JSON rows, one per checkpoint; a pickle store converts without loss.

Earlier versions kept checkpoints with diskcache's default pickle, first as one value per
session (``session_key -> tuple of dicts``), then one row per checkpoint. Either converts to
JSON when the store opens; nothing in the store is ever unpickled as code. Sizes, never timings.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path

import diskcache

import store.checkpoints as checkpoints_module
from store.checkpoints import Checkpoint, DiskCheckpoints

PLANTED = "planted-pickle-ran"


class Planted:
    """A pickle that runs code when it is loaded: it creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def add(store: DiskCheckpoints, session: str, n: int, summary: str = "s" * 2000) -> Checkpoint:
    return store.add(session, boundary=f"ev{n}", summary=f"{summary} {n}", state={"paths": [f"/tmp/{n}"]},
                     covered_tokens=100 * n, covered_events=n, model="m", mode="async", previous=None, summary_tokens=50)


def old_checkpoint(session: str, n: int, summary: str = "") -> Checkpoint:
    return Checkpoint(f"cp_old{n}", session, f"ev{n}", summary or f"summary {n}", {"paths": [f"/p/{n}"], "ids": ["A-1"]},
                      10 * n, n, 1_700_000_000.0 + n, "m", n, "async", f"cp_old{n - 1}" if n > 1 else None, 7,
                      {"after": f"ev{n + 1}"})


def write_pickle_store(root: Path, *, tuples: dict[str, int] = {}, rows: dict[str, int] = {}, big: bool = False,
                       planted: Path | None = None) -> dict[str, list[Checkpoint]]:
    """A store as earlier versions wrote it (diskcache's pickle): sessions in the first layout
    (one tuple), sessions in rows, a lease, optionally a checkpoint big enough to be a file of
    its own and a planted pickle that runs code."""
    written: dict[str, list[Checkpoint]] = {}
    cache = diskcache.Cache(str(root / "checkpoints"), size_limit=2**62, eviction_policy="none")
    for session, count in tuples.items():
        written[session] = [old_checkpoint(session, n) for n in range(1, count + 1)]
        cache[session] = tuple(asdict(cp) for cp in written[session])
    for session, count in rows.items():
        written[session] = [old_checkpoint(session, n, "x" * 60_000 if big and n == 1 else "") for n in range(1, count + 1)]
        for cp in written[session]:
            cache[("cp", session, cp.version)] = asdict(cp)
        cache[("cps", session)] = count
    cache.set("lease:summary:t/x", "holder", expire=30)
    if planted is not None:
        cache[("cp", "t/evil", 1)] = Planted(planted)
        cache[("cps", "t/evil")] = 1
    cache.close()
    return written


def modes(root: Path) -> set[int]:
    db = sqlite3.connect(str(root / checkpoints_module.DIRECTORY / "cache.db"))
    try:
        return {row[0] for row in db.execute("SELECT mode FROM Cache")}
    finally:
        db.close()


def test_a_pickle_store_of_either_layout_converts_to_json_without_loss(tmp_path):
    written = write_pickle_store(tmp_path, tuples={"t/first": 3}, rows={"t/rows": 4, "t/big": 2}, big=True)
    store = DiskCheckpoints(tmp_path)
    try:
        for session, checkpoints in written.items():
            assert store.list(session) == checkpoints
        assert store.newest_on_path("t/first", {"ev2": 5}) == (written["t/first"][1], 5)
        new = add(store, "t/first", 4)
        assert new.version == 4
    finally:
        store.close()
    assert not (tmp_path / "checkpoints").exists()  # the pickle store is gone, not kept beside
    assert diskcache.core.MODE_PICKLE not in modes(tmp_path)
    again = DiskCheckpoints(tmp_path)  # a fresh process reads the same, converts nothing twice
    try:
        assert again.list("t/first") == [*written["t/first"], new]
        assert again.list("t/rows") == written["t/rows"] and again.list("t/big") == written["t/big"]
        assert again.delete_session("t/rows") == 4
        assert again.list("t/rows") == []
    finally:
        again.close()


def test_a_planted_pickle_never_runs(tmp_path):
    marker = tmp_path / PLANTED
    written = write_pickle_store(tmp_path, rows={"t/good": 2}, planted=marker)
    store = DiskCheckpoints(tmp_path)  # converting the old store
    try:
        assert store.list("t/good") == written["t/good"]
        assert store.list("t/evil") == []
    finally:
        store.close()
    assert not marker.exists()
    # One planted in the JSON store itself (diskcache's Disk would unpickle it) is skipped too.
    cache = diskcache.Cache(str(tmp_path / checkpoints_module.DIRECTORY), disk=diskcache.JSONDisk)
    key = diskcache.JSONDisk(str(tmp_path)).put(["cp", "t/good", 1])[0]
    cache._sql("UPDATE Cache SET mode = ?, value = ? WHERE key = ?",  # noqa: SLF001 - what an intruder writes
               (diskcache.core.MODE_PICKLE, sqlite3.Binary(__import__("pickle").dumps(Planted(marker))), key))
    cache.close()
    store = DiskCheckpoints(tmp_path)
    try:
        assert store.list("t/good") == written["t/good"][1:]
    finally:
        store.close()
    assert not marker.exists()


def test_bytes_written_per_add_do_not_grow_with_the_session(tmp_path, monkeypatch):
    written: list[int] = []
    real_set = diskcache.Cache.set

    def recording_set(self, key, value, *args, **kwargs):
        written.append(len(repr(value)))
        return real_set(self, key, value, *args, **kwargs)

    monkeypatch.setattr(diskcache.Cache, "set", recording_set)
    store = DiskCheckpoints(tmp_path)
    try:
        per_add = []
        for n in range(1, 61):
            before = len(written)
            add(store, "t:long", n)
            per_add.append(sum(written[before:]))
        assert per_add[-1] < 1.2 * per_add[0]  # a layout of one value per session wrote ~60x the first add's bytes here
        assert [cp.version for cp in store.list("t:long")] == list(range(1, 61))
        store._memo.clear()  # noqa: SLF001 - read back from disk, not the memo
        assert [cp.boundary for cp in store.list("t:long")] == [f"ev{n}" for n in range(1, 61)]
    finally:
        store.close()
    assert modes(tmp_path) <= {diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY}


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
