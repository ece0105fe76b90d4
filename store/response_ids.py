"""Which recorded answer a Responses API id names (``previous_response_id``, GET/DELETE by id).

When the gateway records an answer of ``POST /v1/responses`` it remembers the provider's
response id with the session and the answer's event id, so a later request that continues from
that id is rebuilt from the ledger (and compacted), and a read or delete of that id is answered
for the tenant that owns the session only. A small SQLite file next to the ledger; each replica
keeps its own (like the turn log), so with replicas a chain continues on the replica that
answered its previous request (session affinity) or passes through untouched.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    response_id: str
    session_key: str  # "tenant/hash": the owner is the tenant before the slash
    event_id: str  # the answer's event in the ledger
    created: float

    @property
    def tenant(self) -> str:
        return self.session_key.split("/", 1)[0]


class ResponseIds:
    def __init__(self, path: str | Path) -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(root / "responses.sqlite3"), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=2000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, session_key TEXT NOT NULL, "
            "event_id TEXT NOT NULL, created REAL NOT NULL, deleted INTEGER NOT NULL DEFAULT 0)")
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_by_session ON responses (session_key)")
        self._db.execute("CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL)")
        self._lock = threading.Lock()

    def secret(self) -> bytes:
        """This store's signing secret (made once, kept): compaction items name checkpoints with it."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO secrets VALUES ('compaction', ?)", (secrets.token_bytes(32),))
            return self._db.execute("SELECT value FROM secrets WHERE name = 'compaction'").fetchone()[0]

    def remember(self, response_id: str, session_key: str, event_id: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, 0)",
                             (response_id, session_key, event_id, time.time()))

    def find(self, response_id: str) -> RecordedResponse | None:
        with self._lock:
            row = self._db.execute("SELECT id, session_key, event_id, created FROM responses WHERE id = ? AND deleted = 0",
                                   (response_id,)).fetchone()
        return RecordedResponse(*row) if row else None

    def forget(self, response_id: str) -> None:
        """A deleted response id is refused from then on (its events stay in the ledger)."""
        with self._lock:
            self._db.execute("UPDATE responses SET deleted = 1 WHERE id = ?", (response_id,))

    def delete_session(self, session_key: str) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE session_key = ?", (session_key,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
