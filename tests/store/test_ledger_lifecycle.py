"""The embedded ledger's lifecycle: schema versions and migration from a store written before
versioning, deleting a session, the retention sweep, and answers committed without deferral."""

from __future__ import annotations

import sqlite3
import time

import orjson
import pytest

from store import delete_session, sweep_expired
from store.canonical import event_id, path_ids, stored_form
from store.checkpoints import DiskCheckpoints
from store.ledger import Ledger, SessionRef
from store.migrations import SQLITE_VERSION, SchemaTooNew

# The schema exactly as the gateway at commit 5b1acfd wrote it (no version recorded).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    session_key TEXT NOT NULL,
    id          TEXT NOT NULL,
    parent      TEXT,
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    created     REAL NOT NULL,
    message     BLOB NOT NULL,
    PRIMARY KEY (session_key, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_by_seq ON events (session_key, seq);
CREATE INDEX IF NOT EXISTS events_by_parent ON events (session_key, parent, kind);
CREATE TABLE IF NOT EXISTS sessions (
    key        TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    created    REAL NOT NULL,
    updated    REAL NOT NULL,
    events     INTEGER NOT NULL DEFAULT 0,
    head       TEXT,
    requests   INTEGER NOT NULL DEFAULT 0,
    model      TEXT
);
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, updated);
"""

HISTORY = [
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "answer one"},
    {"role": "user", "content": "second"},
]


def write_old_store(root) -> SessionRef:
    """A ledger file as the previous version left it: WAL, its schema, one session of 3 events."""
    root.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(root / "ledger.sqlite3"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    ref = SessionRef("tenant-a", "old-session")
    ids = path_ids(HISTORY)
    now = time.time() - 100
    for seq, (eid, message) in enumerate(zip(ids, HISTORY)):
        stored = stored_form(message)
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (ref.key, eid, ids[seq - 1] if seq else None, seq, stored["role"], "message", now, orjson.dumps(stored)))
    db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
               (ref.key, ref.tenant, ref.session_id, now, now, 3, ids[-1], 2, "m"))
    db.close()
    return ref


def on_disk_version(root) -> int:
    """The schema version the database file says it has, read by a connection of its own."""
    db = sqlite3.connect(str(root / "ledger.sqlite3"))
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_store_of_the_previous_version_opens_and_keeps_working(tmp_path):
    ref = write_old_store(tmp_path / "data")
    ledger = Ledger(tmp_path / "data")
    try:
        assert ledger.migrated_from == 1
        assert on_disk_version(tmp_path / "data") == SQLITE_VERSION == 2
        record = ledger.session(ref.key)
        assert (record.events, record.requests, record.model) == (3, 2, "m")
        # Resending the old conversation finds every old event: nothing is appended twice.
        assert ledger.sync(ref, HISTORY).added == 0
        grown = HISTORY + [{"role": "assistant", "content": "answer two"}, {"role": "user", "content": "third"}]
        assert ledger.sync(ref, grown).added == 2
        assert [e.seq for e in ledger.since(ref.key, -1)] == [0, 1, 2, 3, 4]
    finally:
        ledger.close()
    # Opening again is a no-op migration.
    again = Ledger(tmp_path / "data")
    assert again.migrated_from == SQLITE_VERSION
    assert len(again.since(ref.key, -1)) == 5
    again.close()


def test_fresh_store_starts_at_the_newest_version(tmp_path):
    ledger = Ledger(tmp_path)
    assert ledger.migrated_from == 0
    assert on_disk_version(tmp_path) == SQLITE_VERSION
    ledger.close()


def test_store_from_a_newer_gateway_is_refused(tmp_path):
    Ledger(tmp_path).close()
    db = sqlite3.connect(str(tmp_path / "ledger.sqlite3"))
    db.execute(f"PRAGMA user_version = {SQLITE_VERSION + 1}")
    db.close()
    with pytest.raises(SchemaTooNew):
        Ledger(tmp_path)


async def test_delete_session_removes_events_and_checkpoints_and_other_sessions_stay(tmp_path):
    ledger, checkpoints = Ledger(tmp_path), DiskCheckpoints(tmp_path)
    gone, kept = SessionRef("t", "gone"), SessionRef("t", "kept")
    for ref in (gone, kept):
        ids = ledger.sync(ref, HISTORY).ids
        checkpoints.add(ref.key, boundary=ids[1], summary="s", state={}, covered_tokens=1, covered_events=2,
                        model="m", mode="async", previous=None, summary_tokens=1)
    result = await delete_session(gone.key, ledger=ledger, checkpoints=checkpoints)
    assert result == {"events": 3, "checkpoints": 1}
    assert ledger.session(gone.key) is None and ledger.since(gone.key, -1) == []
    assert checkpoints.list(gone.key) == []
    assert len(ledger.since(kept.key, -1)) == 3 and len(checkpoints.list(kept.key)) == 1
    # The same session id comes back as a new session: its messages are recorded again,
    # although this process's known-event cache had them.
    assert ledger.sync(gone, HISTORY).added == 3
    ledger.close()
    checkpoints.close()


async def test_a_deletion_failing_half_way_leaves_the_session_listed_and_can_be_run_again(tmp_path):
    ledger, checkpoints = Ledger(tmp_path), DiskCheckpoints(tmp_path)
    ref = SessionRef("t", "half")
    ids = ledger.sync(ref, HISTORY).ids
    checkpoints.add(ref.key, boundary=ids[1], summary="s", state={}, covered_tokens=1, covered_events=2,
                    model="m", mode="async", previous=None, summary_tokens=1)

    class FailingResponses:
        def delete_session(self, key):
            raise OSError("disk gone")

    with pytest.raises(OSError):
        await delete_session(ref.key, ledger=ledger, checkpoints=checkpoints, responses=FailingResponses())
    # The checkpoints went first; the session is still there, so the deletion is not lost.
    assert checkpoints.list(ref.key) == [] and ledger.session(ref.key) is not None
    assert await delete_session(ref.key, ledger=ledger, checkpoints=checkpoints) == {"events": 3, "checkpoints": 0}
    assert ledger.session(ref.key) is None
    ledger.close()
    checkpoints.close()


def test_delete_through_another_process_is_not_hidden_by_the_known_event_cache(tmp_path):
    gateway, cli = Ledger(tmp_path), Ledger(tmp_path)
    ref = SessionRef("t", "s")
    gateway.sync(ref, HISTORY)  # the gateway caches these ids as known
    cli.delete_session(ref.key)
    assert gateway.sync(ref, HISTORY).added == 3
    assert len(cli.since(ref.key, -1)) == 3
    gateway.close()
    cli.close()


async def test_retention_sweep_deletes_only_sessions_idle_longer_than_the_ttl(tmp_path):
    ledger, checkpoints = Ledger(tmp_path), DiskCheckpoints(tmp_path)
    old, fresh = SessionRef("t", "old"), SessionRef("t", "fresh")
    ledger.sync(old, HISTORY)
    ledger.sync(fresh, HISTORY)
    ledger._db.execute("UPDATE sessions SET updated = ? WHERE key = ?", (time.time() - 10 * 86400, old.key))
    assert await sweep_expired(7, ledger=ledger, checkpoints=checkpoints) == 1
    assert ledger.session(old.key) is None and ledger.session(fresh.key) is not None
    assert await sweep_expired(7, ledger=ledger, checkpoints=checkpoints) == 0
    ledger.close()
    checkpoints.close()


def test_answer_is_committed_when_append_returns(tmp_path):
    """An answer reaches the database before `append` returns (no window of buffered writes):
    another connection sees it without any flush."""
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    ids = ledger.sync(ref, HISTORY[:1]).ids
    answer = {"role": "assistant", "content": "kept"}
    event = ledger.append(ref, ids[-1], answer, defer=True)
    assert event.id == event_id(ids[-1], answer)
    reader = sqlite3.connect(str(tmp_path / "ledger.sqlite3"))
    assert reader.execute("SELECT COUNT(*) FROM events WHERE id = ?", (event.id,)).fetchone()[0] == 1
    reader.close()
    ledger.close()


def test_append_returns_the_event_as_stored_and_writes_an_answer_once(tmp_path):
    """The Event `append` returns without reading it back is the one a read returns; an answer
    appended again (another process wrote it, or a resend) is not written twice; a conflict
    other than the event's own id (its seq taken) is an error, not a silent skip."""
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    ids = ledger.sync(ref, HISTORY[:1]).ids
    answer = {"role": "assistant", "content": "kept", "tool_calls": None}
    event = ledger.append(ref, ids[-1], answer)
    assert event == ledger.get(ref.key, event.id)
    other = Ledger(tmp_path)  # a second process: its known-event cache is empty
    assert other.append(ref, ids[-1], answer) == event
    reader = sqlite3.connect(str(tmp_path / "ledger.sqlite3"))
    assert reader.execute("SELECT COUNT(*) FROM events WHERE session_key = ?", (ref.key,)).fetchone()[0] == 2
    assert reader.execute("SELECT events FROM sessions WHERE key = ?", (ref.key,)).fetchone()[0] == 2
    reader.execute("UPDATE sessions SET events = events - 1 WHERE key = ?", (ref.key,))  # the next seq is taken
    reader.commit()
    reader.close()
    with pytest.raises(sqlite3.IntegrityError):
        other.append(ref, event.id, {"role": "user", "content": "next"})
    ledger.close()
    other.close()


def test_deferred_answers_remain_available_as_an_option(tmp_path):
    ledger = Ledger(tmp_path, defer_answers=True)
    ref = SessionRef("t", "s")
    ids = ledger.sync(ref, HISTORY[:1]).ids
    event = ledger.append(ref, ids[-1], {"role": "assistant", "content": "later"}, defer=True)
    reader = sqlite3.connect(str(tmp_path / "ledger.sqlite3"))
    assert reader.execute("SELECT COUNT(*) FROM events WHERE id = ?", (event.id,)).fetchone()[0] == 0
    ledger.flush()
    assert reader.execute("SELECT COUNT(*) FROM events WHERE id = ?", (event.id,)).fetchone()[0] == 1
    reader.close()
    ledger.close()


def test_summary_lease_is_exclusive_until_released_or_expired(tmp_path):
    a, b = DiskCheckpoints(tmp_path), DiskCheckpoints(tmp_path)
    assert a.acquire_lease("sess", "a", 60)
    assert not b.acquire_lease("sess", "b", 60)
    assert a.acquire_lease("sess", "a", 60)  # renew
    a.release_lease("sess", "a")
    assert b.acquire_lease("sess", "b", 0.05)
    time.sleep(0.1)
    assert a.acquire_lease("sess", "a", 60)  # b's lease expired
    a.close()
    b.close()


def test_a_lease_whose_holder_process_is_gone_is_free(tmp_path):
    """kill -9 during a summary leaves its lease behind; the restarted gateway on the same
    host must not wait for it to expire before summarising that session again."""
    import os
    import subprocess
    import sys

    from store.holders import HOST, HOLDER

    checkpoints = DiskCheckpoints(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_holder = f"{HOST}:{int(dead.stdout)}:dead"
    assert checkpoints.acquire_lease("summary:s", dead_holder, 600)
    assert checkpoints.acquire_lease("summary:s", HOLDER, 600)  # its process is gone: taken over
    # A live holder on this host, or any holder on another host, keeps its lease until it expires.
    assert not checkpoints.acquire_lease("summary:s", f"{HOST}:{os.getpid()}:other", 600)
    assert checkpoints.acquire_lease("summary:t", "elsewhere:1:x", 600)
    assert not checkpoints.acquire_lease("summary:t", HOLDER, 600)
    checkpoints.close()


class _LockedAtCheckpoint:
    """The ledger's connection as a worker thread still reading at shutdown leaves it: the WAL
    checkpoint finds the table locked (SQLITE_LOCKED)."""

    def __init__(self, db):
        self.db = db

    def execute(self, sql, *args):
        if "wal_checkpoint" in sql:
            raise sqlite3.OperationalError("database table is locked")
        return self.db.execute(sql, *args)

    def close(self):
        self.db.close()


def test_close_survives_a_reader_holding_the_table_and_nothing_is_lost(tmp_path, caplog):
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    ledger.sync(ref, [{"role": "user", "content": "keep me"}])
    ledger._db = _LockedAtCheckpoint(ledger._db)
    ledger.close()  # no exception at shutdown
    assert "WAL not truncated" in caplog.text
    reopened = Ledger(tmp_path)
    key = reopened.sessions()[0].key
    assert [e.message["content"] for e in reopened.since(key, -1) if e.kind == "message"] == ["keep me"]
    reopened.close()
