"""The event ledger: content-addressed, append-only, fork-aware (docs/architecture.md, "Ledger").

Every non-system message becomes an event whose id hashes its parent's id and its canonical
form, so the message list of a request maps to a path of ids. Known ids are skipped and new
ones appended; an edited or regenerated turn starts a new branch, nothing is overwritten.
Messages the gateway makes itself (recall calls and results) are *side events* hung off the
node where they happened: they never take part in path matching.

The embedded backend is SQLite in WAL mode under ``store.path`` (``ledger.sqlite3``), used
directly rather than through diskcache's key-value layer: the ledger needs secondary lookups
(events in insertion order, children of a node) and one request's writes must be a handful of
statements, not five per key (that layer cost ~4 ms of a short request). Writes of one request
happen in one transaction before the upstream call starts, so a crash loses no client message,
and concurrent requests on one session never duplicate or lose events (``BEGIN IMMEDIATE``
also serialises writers across processes).
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import orjson

from store.canonical import event_id, path_ids, stored_form
from store.records import Event, PathSync, SessionRecord, SessionRef
from store.interfaces import StoreBusy, on_event_loop
from store.migrations import migrate_sqlite

log = logging.getLogger("palimpsest.ledger")


def event_row(sk: str, parent: str | None, eid: str, seq: int, message: dict, kind: str, now: float) -> tuple:
    """One events row, as both ledger backends store it (the message in its stored form)."""
    stored = stored_form(message)
    return (sk, eid, parent, seq, str(stored.get("role")), kind, now, orjson.dumps(stored))


def new_epoch() -> str:
    """A session incarnation: a deleted session that comes back is a new one."""
    return secrets.token_hex(8)


_EVENT_COLUMNS = "id, parent, seq, role, message, created, kind"
SEEN_CACHE = 100_000  # (session, event id) pairs known to exist


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _event(row) -> Event:
    return Event(row[0], row[1], row[2], row[3], orjson.loads(row[4]), row[5], row[6])


def _session(row) -> SessionRecord:
    return SessionRecord(*row)


def side_event_rows(sk: str, node: str | None, existing: int, seq: int, messages: Iterable[dict], now: float) -> list[tuple]:
    """Rows for gateway-made messages hung off `node`, which has `existing` side events already.
    Side events chain among themselves, so identical recall rounds stay distinct."""
    rows: list[tuple] = []
    for message in messages:
        eid = event_id(f"side:{node}:{existing + len(rows)}", message)
        rows.append(event_row(sk, node, eid, seq + len(rows), message, "side", now))
    return rows


class Ledger:
    """SQLite-backed ledger. Synchronous calls: each is short and runs one transaction."""

    blocking = False  # sub-millisecond local calls: the gateway runs them inline (store.call)

    def __init__(self, path: str | Path, *, synchronous: str = "normal", defer_answers: bool = False,
                 busy_timeout_s: float = 10.0) -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(str(root / "ledger.sqlite3"), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        # No busy wait inside SQLite: a writer that finds the database locked by another process
        # (a CLI, a second gateway) must not hold the event loop for up to `busy_timeout_s`.
        # `_transaction` waits itself: off the loop it retries, on the loop it raises StoreBusy
        # and `store.call` moves the call to a worker thread.
        self._db.execute("PRAGMA busy_timeout=0")
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()  # the connection is shared by the loop and worker threads
        # No automatic WAL checkpoints on the request path: a checkpoint syncs the database
        # file, which is what made the slowest requests slow. `checkpoint()` runs them from
        # a worker thread on its own connection instead.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self.migrated_from = migrate_sqlite(self._db)
        self._path = root / "ledger.sqlite3"
        self._defer_answers = defer_answers
        # Upstream answers waiting to be written: (ref, parent, message). See `append`.
        self._pending: list[tuple[SessionRef, str | None, dict]] = []
        # (session, epoch, event id) known to exist: keyed by the session's incarnation, so a
        # session deleted (and perhaps started again) by another process never hits it.
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._epochs: dict[str, str] = {}  # session key -> the epoch it had when last opened here

    # -- writing ---------------------------------------------------------------------------

    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None, model: str | None = None) -> PathSync:
        """Map non-system messages to their path of ids, appending the ones not yet known.

        `ids` may be passed when the caller already hashed the messages (``path_ids``).
        Also counts the request on the session."""
        sk = ref.key
        if ids is None:
            ids = path_ids(messages)
        db = self._db
        if not ids:
            return PathSync(ids, 0)
        # One transaction, one commit: the previous turns' deferred answers, then whatever of
        # this path is new (usually the last message or two: walk back to the newest known).
        with self._transaction():
            self._write_pending()
            now = time.time()
            # A new session's row is written whole with its first events (one insert, no update).
            seq, epoch, fresh = self._open_session(ref, (len(ids), ids[-1], now, 1, model))
            seen = self._seen
            # The next step of a path this process synced (the message before the last known
            # here, the last not): the last is inserted unless the session holds it already (an
            # insert that does nothing on the primary key, not a look-up and an insert).
            step = bool(seq) and len(ids) > 1 and (sk, epoch, ids[-2]) in seen and (sk, epoch, ids[-1]) not in seen
            if not step and seq and self._known(sk, epoch, ids[-1]):
                db.execute("UPDATE sessions SET requests = requests + 1, model = ? WHERE key = ?", (model, sk))
                return PathSync(ids, 0)
            # A session without events (its first request) knows none of them: no look-up per
            # message (a 500 KB history's first request asked ~450 times). Its event count is
            # exact: every insert moves it, and the (session, seq) index relies on it.
            first_new = len(ids) - 1 if seq else 0
            while not step and first_new > 0 and not self._known(sk, epoch, ids[first_new - 1]):
                first_new -= 1
            rows = [
                event_row(sk, ids[i - 1] if i else None, ids[i], seq + n, messages[i], "message", now)
                for n, i in enumerate(range(first_new, len(ids)))
            ]
            if step and not db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                                       "ON CONFLICT (session_key, id) DO NOTHING", rows[0]).rowcount:
                self._remember((sk, epoch, ids[-1]))  # another process wrote it since: known
                db.execute("UPDATE sessions SET requests = requests + 1, model = ? WHERE key = ?", (model, sk))
                return PathSync(ids, 0)
            if not step:
                db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            if not fresh:
                db.execute("UPDATE sessions SET events = events + ?, head = ?, updated = ?, requests = requests + 1, model = ? "
                           "WHERE key = ?", (len(rows), ids[-1], now, model, sk))
            for row in rows:
                self._remember((sk, epoch, row[1]))
        return PathSync(ids, len(rows))

    def append(self, ref: SessionRef, parent: str | None, message: dict, *, defer: bool = False) -> Event:
        """Record one message (the upstream's answer) as the child of `parent`.

        With `defer` and a ledger opened with ``defer_answers``, the write joins the next
        transaction (the next request's sync, a read, or `flush`, at most ~0.5 s later) instead
        of paying a commit of its own. By default it commits now: a commit in WAL mode costs
        a fraction of a millisecond (bench/cluster.py measures it), less than the answer is
        worth if the process dies in that window. The client holds the answer and resends it
        next turn, and its content address makes the resend land on the same event."""
        eid = event_id(parent, message)
        if defer and self._defer_answers:
            self._pending.append((ref, parent, message))
            return Event(eid, parent, -1, str(message.get("role")), stored_form(message), time.time())
        with self._transaction():
            self._write_pending()
            row = self._insert_one(ref, parent, eid, message)
        if row is None:  # the session held it already: as stored
            return self.get(ref.key, eid)  # type: ignore[return-value]
        return _event((row[1], row[2], row[3], row[4], row[7], row[6], row[5]))  # the row just written, not read back

    def flush(self) -> None:
        """Write deferred answers now."""
        if self._pending:
            with self._transaction():
                self._write_pending()

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        for ref, parent, message in pending:
            self._insert_one(ref, parent, event_id(parent, message), message)

    def _insert_one(self, ref: SessionRef, parent: str | None, eid: str, message: dict) -> tuple | None:
        """The events row written, or None when the session holds the event already (an insert
        that does nothing on the primary key, not a look-up and an insert; any other conflict,
        a seq taken, still raises)."""
        seq, epoch, _ = self._open_session(ref)
        key = (ref.key, epoch, eid)
        if key in self._seen:
            return None
        now = time.time()
        row = event_row(ref.key, parent, eid, seq, message, "message", now)
        written = self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                                   "ON CONFLICT (session_key, id) DO NOTHING", row).rowcount
        self._remember(key)
        if not written:
            return None
        self._db.execute("UPDATE sessions SET events = events + 1, head = ?, updated = ? WHERE key = ?", (eid, now, ref.key))
        return row

    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]:
        """Gateway-made messages (recall calls and results), hung off `node`."""
        out = []
        with self._transaction():
            self._write_pending()
            seq, _, _ = self._open_session(ref)
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM events WHERE session_key = ? AND parent IS ? AND kind = 'side'", (ref.key, node)
            ).fetchone()
            now = time.time()
            rows = side_event_rows(ref.key, node, count, seq, messages, now)
            out = [row[1] for row in rows]
            self._db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("UPDATE sessions SET events = events + ?, updated = ? WHERE key = ?", (len(rows), now, ref.key))
        return self.get_many(ref.key, out)

    @contextmanager
    def _transaction(self):
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            if not on_event_loop():
                self._lock.acquire()
            elif not self._lock.acquire(blocking=False):
                # A worker thread holds the connection (a big sync): the loop must not wait on it;
                # `store.call` moves this call to a worker thread too.
                raise StoreBusy("the ledger is busy with a write in a worker thread")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                self._lock.release()
                if not _is_busy(exc):
                    raise
                if on_event_loop():
                    raise StoreBusy("the ledger is locked by another writer") from exc
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)  # our lock is released meanwhile: readers on the loop go on
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        else:
            self._db.execute("COMMIT")
        finally:
            self._lock.release()

    def _known(self, sk: str, epoch: str, eid: str) -> bool:
        # Events of one session incarnation are never deleted, so "known" can be cached;
        # "unknown" must always be asked (another process may share the store).
        key = (sk, epoch, eid)
        if key in self._seen:
            return True
        found = self._db.execute("SELECT 1 FROM events WHERE session_key = ? AND id = ?", (sk, eid)).fetchone() is not None
        if found:
            self._remember(key)
        return found

    def _note_epoch(self, session_key: str, epoch: str) -> None:
        """The incarnation of the session this process last opened (for ``holds``), bounded."""
        if len(self._epochs) >= SEEN_CACHE and session_key not in self._epochs:
            self._epochs.clear()
        self._epochs[session_key] = epoch

    def _remember(self, key: tuple[str, str, str]) -> None:
        self._seen[key] = None
        if len(self._seen) > SEEN_CACHE:
            self._seen.popitem(last=False)

    def _open_session(self, ref: SessionRef, first: tuple = ()) -> tuple[int, str, bool]:
        """(the session's next seq, its epoch, whether its record was created here), creating it
        if needed (in a transaction): with `first` (events, head, updated, requests, model) set
        when the caller writes exactly those (a first sync), else empty."""
        row = self._db.execute("SELECT events, epoch FROM sessions WHERE key = ?", (ref.key,)).fetchone()
        if row is not None:
            self._note_epoch(ref.key, row[1])
            return row[0], row[1], False
        now, epoch = first[2] if first else time.time(), new_epoch()  # a first sync's row: created when updated
        self._note_epoch(ref.key, epoch)
        self._db.execute("INSERT INTO sessions (key, tenant, session_id, created, epoch, events, head, updated, requests, model) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (ref.key, ref.tenant, ref.session_id, now, epoch,
                                                                   *(first or (0, None, now, 0, None))))
        return 0, epoch, bool(first)

    # -- reading ---------------------------------------------------------------------------

    def holds(self, session_key: str, eid: str, *, cached: bool = True) -> bool:
        """Whether the session holds event `eid`: the known-events cache of this process (an
        event this process wrote or found, of the session's incarnation it last opened), else
        one look-up on the primary key's index (no row, no message read). A session another
        process deleted since may answer True from the cache: callers choose where to sync by
        it, and ``sync`` asks again under its lock; ``cached=False`` always looks."""
        epoch = self._epochs.get(session_key)
        if cached and epoch is not None and (session_key, epoch, eid) in self._seen:
            return True
        self.flush()
        return self._db.execute("SELECT 1 FROM events WHERE session_key = ? AND id = ?", (session_key, eid)).fetchone() is not None

    def get(self, session_key: str, eid: str) -> Event | None:
        self.flush()
        row = self._db.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = ? AND id = ?", (session_key, eid)
        ).fetchone()
        return _event(row) if row is not None else None

    def get_many(self, session_key: str, ids: Iterable[str]) -> list[Event]:
        """The events of `ids` the session holds, in the order asked: one query per 500 ids
        (SQLite's bound-variable limit), not one per id."""
        wanted = list(ids)
        if not wanted:
            return []
        self.flush()
        found: dict[str, Event] = {}
        distinct = list(dict.fromkeys(wanted))
        for at in range(0, len(distinct), 500):
            chunk = distinct[at:at + 500]
            rows = self._db.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = ? AND id IN "
                                    f"({', '.join('?' * len(chunk))})", (session_key, *chunk)).fetchall()
            found.update((row[0], _event(row)) for row in rows)
        return [found[i] for i in wanted if i in found]

    def since(self, session_key: str, seq: int) -> list[Event]:
        """Events appended after `seq`, in insertion order (the index catches up with this)."""
        self.flush()
        rows = self._db.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = ? AND seq > ? ORDER BY seq", (session_key, seq)
        ).fetchall()
        return [_event(r) for r in rows]

    def children(self, session_key: str, eid: str | None) -> tuple[str, ...]:
        self.flush()
        rows = self._db.execute(
            "SELECT id FROM events WHERE session_key = ? AND parent IS ? AND kind = 'message' ORDER BY seq", (session_key, eid)
        ).fetchall()
        return tuple(r[0] for r in rows)

    def side_events(self, session_key: str, node: str | None) -> list[Event]:
        rows = self._db.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = ? AND parent IS ? AND kind = 'side' ORDER BY seq",
            (session_key, node),
        ).fetchall()
        return [_event(r) for r in rows]

    def path_to(self, session_key: str, eid: str) -> list[Event]:
        """The path from the root to `eid` (walks parents; for the inspector, not the hot path)."""
        out = []
        current: str | None = eid
        while current is not None:
            event = self.get(session_key, current)
            if event is None:
                break
            out.append(event)
            current = event.parent
        out.reverse()
        return out

    def heads(self, session_key: str) -> list[str]:
        """Leaves of the session's tree: one per branch, oldest first."""
        self.flush()
        rows = self._db.execute(
            """SELECT e.id FROM events e WHERE e.session_key = ? AND e.kind = 'message' AND NOT EXISTS (
                   SELECT 1 FROM events c WHERE c.session_key = e.session_key AND c.parent = e.id AND c.kind = 'message')
               ORDER BY e.seq""",
            (session_key,),
        ).fetchall()
        return [r[0] for r in rows]

    def has_session(self, session_key: str) -> bool:
        """Whether the session has a row (events): True for one opened here (or that was: the safe
        answer, the caller reads on), else one indexed read, without the flush of `session`."""
        return session_key in self._epochs or self._db.execute("SELECT 1 FROM sessions WHERE key = ?", (session_key,)).fetchone() is not None

    def session(self, session_key: str) -> SessionRecord | None:
        self.flush()
        row = self._db.execute(
            "SELECT key, tenant, session_id, created, updated, events, head, requests, model FROM sessions WHERE key = ?", (session_key,)
        ).fetchone()
        return _session(row) if row else None

    def sessions(self, tenant: str | None = None) -> list[SessionRecord]:
        self.flush()
        query = "SELECT key, tenant, session_id, created, updated, events, head, requests, model FROM sessions"
        rows = (self._db.execute(query + " WHERE tenant = ? ORDER BY updated DESC", (tenant,)) if tenant is not None
                else self._db.execute(query + " ORDER BY updated DESC")).fetchall()
        return [_session(r) for r in rows]

    # -- lifecycle -------------------------------------------------------------------------

    def delete_session(self, session_key: str) -> int:
        """Delete a session's events and record; returns the number of events deleted."""
        with self._transaction():
            self._write_pending()
            deleted = self._db.execute("DELETE FROM events WHERE session_key = ?", (session_key,)).rowcount
            self._db.execute("DELETE FROM sessions WHERE key = ?", (session_key,))
        self._epochs.pop(session_key, None)
        return deleted

    def expired(self, before: float) -> list[str]:
        """Keys of sessions not updated since `before` (epoch seconds): the retention sweep."""
        self.flush()
        return [r[0] for r in self._db.execute("SELECT key FROM sessions WHERE updated < ? ORDER BY updated", (before,))]

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (blocking: call it from a worker thread)."""
        db = sqlite3.connect(str(self._path), timeout=10)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def ping(self) -> None:
        """Raises when the database cannot be read (the readiness probe)."""
        self._db.execute("SELECT 1 FROM sessions LIMIT 1").fetchall()

    def session_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]

    def tenant_bytes(self, tenant: str) -> int:
        # Session keys are "tenant/hash": the tenant's sessions are one range of the primary key.
        row = self._db.execute("SELECT COALESCE(SUM(LENGTH(message)), 0) FROM events WHERE session_key >= ? AND session_key < ?",
                               (tenant + "/", tenant + "0")).fetchone()
        return int(row[0])

    def volume_bytes(self) -> int:
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (size,) = self._db.execute("PRAGMA page_size").fetchone()
        return int(pages * size)

    def close(self) -> None:
        self.flush()
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError as exc:
                # A worker thread still reading at shutdown (a search that outlived its request)
                # holds the table: the WAL stays, and the next open checkpoints it. Nothing is lost.
                log.warning("ledger: WAL not truncated at close (%s)", exc)
            self._db.close()
