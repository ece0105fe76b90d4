"""The event ledger: content-addressed, append-only, fork-aware (DESIGN §3).

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

import hashlib
import sqlite3
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

import orjson

from store.canonical import event_id, path_ids, stored_form


@dataclass(frozen=True, slots=True)
class SessionRef:
    """Who a request belongs to: the tenant and its own session id."""

    tenant: str
    session_id: str
    key: str = field(init=False, repr=False, compare=False)  # "tenant/hash": the storage key

    def __post_init__(self) -> None:
        digest = hashlib.blake2b(self.session_id.encode(), digest_size=10).hexdigest()
        object.__setattr__(self, "key", f"{self.tenant}/{digest}")


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    parent: str | None
    seq: int
    role: str
    message: dict
    created: float
    kind: str = "message"  # "message" (on a path) or "side" (gateway-made, hung off `parent`)


@dataclass(slots=True)
class SessionRecord:
    key: str
    tenant: str
    session_id: str
    created: float
    updated: float
    events: int = 0
    head: str | None = None
    requests: int = 0
    model: str | None = None  # of the newest request


@dataclass(frozen=True, slots=True)
class PathSync:
    ids: list[str]
    added: int


class LedgerStore(Protocol):
    """The interface the gateway depends on; scale-out backends implement the same."""

    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None, model: str | None = None) -> PathSync: ...
    def append(self, ref: SessionRef, parent: str | None, message: dict) -> Event: ...
    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]: ...
    def get(self, session_key: str, eid: str) -> Event | None: ...
    def since(self, session_key: str, seq: int) -> list[Event]: ...
    def session(self, session_key: str) -> SessionRecord | None: ...
    def sessions(self, tenant: str | None = None) -> list[SessionRecord]: ...
    def close(self) -> None: ...


_SCHEMA = """
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
_EVENT_COLUMNS = "id, parent, seq, role, message, created, kind"
SEEN_CACHE = 100_000  # (session, event id) pairs known to exist


def _event(row) -> Event:
    return Event(row[0], row[1], row[2], row[3], orjson.loads(row[4]), row[5], row[6])


def _session(row) -> SessionRecord:
    return SessionRecord(*row)


class Ledger:
    """SQLite-backed ledger. Synchronous calls: each is short and runs one transaction."""

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(str(root / "ledger.sqlite3"), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self._db.execute("PRAGMA busy_timeout=10000")
        # No automatic WAL checkpoints on the request path: a checkpoint syncs the database
        # file, which is what made the slowest requests slow. `checkpoint()` runs them from
        # a worker thread on its own connection instead.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._db.executescript(_SCHEMA)
        self._path = root / "ledger.sqlite3"
        # Upstream answers waiting to be written: (ref, parent, message). See `append`.
        self._pending: list[tuple[SessionRef, str | None, dict]] = []
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

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
            if self._known(sk, ids[-1]):
                db.execute("UPDATE sessions SET requests = requests + 1, model = ? WHERE key = ?", (model, sk))
                return PathSync(ids, 0)
            first_new = len(ids) - 1
            while first_new > 0 and not self._known(sk, ids[first_new - 1]):
                first_new -= 1
            seq, _ = self._open_session(ref)
            now = time.time()
            rows = [
                self._row(sk, ids[i - 1] if i else None, ids[i], seq + n, messages[i], "message", now)
                for n, i in enumerate(range(first_new, len(ids)))
            ]
            db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            db.execute(
                "UPDATE sessions SET events = events + ?, head = ?, updated = ?, requests = requests + 1, model = ? WHERE key = ?",
                (len(rows), ids[-1], now, model, sk),
            )
            for row in rows:
                self._remember((sk, row[1]))
        return PathSync(ids, len(rows))

    def append(self, ref: SessionRef, parent: str | None, message: dict, *, defer: bool = False) -> Event:
        """Record one message (the upstream's answer) as the child of `parent`.

        With `defer`, the write joins the next transaction (the next request's sync, a read,
        or `flush`) instead of paying a commit of its own on the request path. An answer is
        the one message that may wait: the client holds it and resends it next turn, and its
        content address makes the resend land on the same event."""
        eid = event_id(parent, message)
        if defer:
            self._pending.append((ref, parent, message))
            return Event(eid, parent, -1, str(message.get("role")), stored_form(message), time.time())
        with self._transaction():
            self._write_pending()
            self._insert_one(ref, parent, eid, message)
        return self.get(ref.key, eid)  # type: ignore[return-value]

    def flush(self) -> None:
        """Write deferred answers now."""
        if self._pending:
            with self._transaction():
                self._write_pending()

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        for ref, parent, message in pending:
            self._insert_one(ref, parent, event_id(parent, message), message)

    def _insert_one(self, ref: SessionRef, parent: str | None, eid: str, message: dict) -> None:
        if self._known(ref.key, eid):
            return
        seq, _ = self._open_session(ref)
        now = time.time()
        self._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._row(ref.key, parent, eid, seq, message, "message", now))
        self._remember((ref.key, eid))
        self._db.execute("UPDATE sessions SET events = events + 1, head = ?, updated = ? WHERE key = ?", (eid, now, ref.key))

    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]:
        """Gateway-made messages (recall calls and results), hung off `node`."""
        out = []
        with self._transaction():
            self._write_pending()
            seq, _ = self._open_session(ref)
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM events WHERE session_key = ? AND parent IS ? AND kind = 'side'", (ref.key, node)
            ).fetchone()
            now = time.time()
            rows = []
            for message in messages:
                # Side events chain among themselves so identical recall rounds stay distinct.
                eid = event_id(f"side:{node}:{count + len(rows)}", message)
                rows.append(self._row(ref.key, node, eid, seq + len(rows), message, "side", now))
                out.append(eid)
            self._db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("UPDATE sessions SET events = events + ?, updated = ? WHERE key = ?", (len(rows), now, ref.key))
        return self.get_many(ref.key, out)

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _known(self, sk: str, eid: str) -> bool:
        # Events are never deleted, so "known" can be cached; "unknown" must always be asked
        # (another process may share the store).
        key = (sk, eid)
        if key in self._seen:
            return True
        found = self._db.execute("SELECT 1 FROM events WHERE session_key = ? AND id = ?", (sk, eid)).fetchone() is not None
        if found:
            self._remember(key)
        return found

    def _remember(self, key: tuple[str, str]) -> None:
        self._seen[key] = None
        if len(self._seen) > SEEN_CACHE:
            self._seen.popitem(last=False)

    def _open_session(self, ref: SessionRef) -> tuple[int, bool]:
        """The session's next seq, creating its record if needed (inside a transaction)."""
        row = self._db.execute("SELECT events FROM sessions WHERE key = ?", (ref.key,)).fetchone()
        if row is not None:
            return row[0], False
        now = time.time()
        self._db.execute(
            "INSERT INTO sessions (key, tenant, session_id, created, updated) VALUES (?, ?, ?, ?, ?)",
            (ref.key, ref.tenant, ref.session_id, now, now),
        )
        return 0, True

    @staticmethod
    def _row(sk: str, parent: str | None, eid: str, seq: int, message: dict, kind: str, now: float) -> tuple:
        stored = stored_form(message)
        return (sk, eid, parent, seq, str(stored.get("role")), kind, now, orjson.dumps(stored))

    # -- reading ---------------------------------------------------------------------------

    def get(self, session_key: str, eid: str) -> Event | None:
        self.flush()
        row = self._db.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = ? AND id = ?", (session_key, eid)
        ).fetchone()
        return _event(row) if row is not None else None

    def get_many(self, session_key: str, ids: Iterable[str]) -> list[Event]:
        return [e for e in (self.get(session_key, i) for i in ids) if e is not None]

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

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (blocking: call it from a worker thread)."""
        db = sqlite3.connect(str(self._path), timeout=10)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def session_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]

    def volume_bytes(self) -> int:
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (size,) = self._db.execute("PRAGMA page_size").fetchone()
        return int(pages * size)

    def close(self) -> None:
        self.flush()
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()
