"""Which recorded answer a Responses API id names (``previous_response_id``, GET/DELETE by id).

When the gateway records an answer of ``POST /v1/responses`` it remembers the provider's
response id for the request's tenant, with the session and the answer's event id, so a later
request of that tenant that continues from that id is rebuilt from the ledger (and compacted),
and a read or delete of that id is answered for that tenant only.

Ids are kept per tenant: the key is (tenant, id), never the id alone. A provider may reuse an
id (or a chat-only upstream give none to derive one from); one tenant's response then never
takes over another's, each finds its own. The ids of each answer's output items are kept the same
way, so an ``item_reference`` is known to be the requesting tenant's, another's, or nobody's
(``item_owners``). The store also keeps the secret compaction items are
sealed with (``secret``), made once.

Embedded: a small SQLite file next to the ledger (``ResponseIds``). With ``store.url`` the same
table lives in PostgreSQL (``store.postgres_responses``), so every replica continues, reads and
expands what another recorded.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SECRET_NAME = "compaction"
LOOKUP_CHUNK = 500  # item ids per lookup statement


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    tenant: str
    response_id: str
    session_key: str  # "tenant/hash", or "" for a response relayed without a session
    event_id: str  # the answer's event in the ledger ("" without a session)
    created: float


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS response_ids (tenant TEXT NOT NULL, id TEXT NOT NULL, session_key TEXT NOT NULL, "
    "event_id TEXT NOT NULL, created REAL NOT NULL, deleted INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (tenant, id))",
    "CREATE INDEX IF NOT EXISTS response_ids_by_session ON response_ids (session_key)",
    "CREATE INDEX IF NOT EXISTS response_ids_by_id ON response_ids (id)",
    "CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
    # The ids of a recorded answer's output items, per tenant: whose an ``item_reference`` is.
    "CREATE TABLE IF NOT EXISTS item_ids (tenant TEXT NOT NULL, id TEXT NOT NULL, session_key TEXT NOT NULL, "
    "PRIMARY KEY (tenant, id))",
    "CREATE INDEX IF NOT EXISTS item_ids_by_session ON item_ids (session_key)",
    "CREATE INDEX IF NOT EXISTS item_ids_by_id ON item_ids (id)",
)
# The first layout keyed rows by the provider's id alone ("responses"); its rows move over
# with the tenant their session key names.
_MIGRATE = (
    "INSERT OR IGNORE INTO response_ids SELECT substr(session_key, 1, instr(session_key, '/') - 1), id, "
    "CASE WHEN event_id = '' THEN '' ELSE session_key END, event_id, created, deleted FROM responses "
    "WHERE instr(session_key, '/') > 0",
    "DROP TABLE responses",
)


def owners_of(rows) -> dict[str, frozenset[str]]:
    """(item id, tenant) rows as each id's tenants."""
    owners: dict[str, set[str]] = {}
    for item_id, tenant in rows:
        owners.setdefault(item_id, set()).add(tenant)
    return {item_id: frozenset(tenants) for item_id, tenants in owners.items()}


class ResponseIds:
    """The embedded backend of ``store.interfaces.ResponseIdStore``."""

    def __init__(self, path: str | Path) -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(root / "responses.sqlite3"), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=2000")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                self._db.execute(statement)
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'responses'").fetchone():
                for statement in _MIGRATE:
                    self._db.execute(statement)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        self._lock = threading.Lock()

    def secret(self) -> bytes:
        """This store's compaction-item secret (made once, kept)."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO secrets VALUES (?, ?)", (SECRET_NAME, secrets.token_bytes(32)))
            return self._db.execute("SELECT value FROM secrets WHERE name = ?", (SECRET_NAME,)).fetchone()[0]

    def remember(self, tenant: str, response_id: str, session_key: str, event_id: str,
                 items: Sequence[str] = ()) -> None:
        """`response_id` names this answer for `tenant` (a newer answer of the same tenant under
        the same id replaces it; another tenant's row is never touched), and `items`, the ids of
        its output items, are `tenant`'s; in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO response_ids VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (tenant, id) DO UPDATE SET "
                    "session_key = excluded.session_key, event_id = excluded.event_id, created = excluded.created, deleted = 0",
                    (tenant, response_id, session_key, event_id, time.time()))
                self._db.executemany("INSERT INTO item_ids VALUES (?, ?, ?) ON CONFLICT (tenant, id) DO UPDATE SET "
                                     "session_key = excluded.session_key", [(tenant, i, session_key) for i in items])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def find(self, tenant: str, response_id: str) -> RecordedResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT tenant, id, session_key, event_id, created FROM response_ids WHERE tenant = ? AND id = ? AND deleted = 0",
                (tenant, response_id)).fetchone()
        return RecordedResponse(*row) if row else None

    def taken(self, response_id: str) -> bool:
        """Whether any tenant has `response_id` recorded (another's must not pass upstream)."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM response_ids WHERE id = ? AND deleted = 0 LIMIT 1",
                                    (response_id,)).fetchone() is not None

    def item_owners(self, item_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        """For each of `item_ids` some tenant's recorded answer had, the tenants it is recorded for."""
        wanted = list(dict.fromkeys(item_ids))
        rows: list[tuple[str, str]] = []
        with self._lock:
            for at in range(0, len(wanted), LOOKUP_CHUNK):  # within SQLite's bound on parameters
                chunk = wanted[at:at + LOOKUP_CHUNK]
                rows += self._db.execute(f"SELECT id, tenant FROM item_ids WHERE id IN ({','.join('?' * len(chunk))})",
                                         chunk).fetchall()
        return owners_of(rows)

    def forget(self, tenant: str, response_id: str) -> None:
        """A deleted response id is refused from then on (its events stay in the ledger)."""
        with self._lock:
            self._db.execute("UPDATE response_ids SET deleted = 1 WHERE tenant = ? AND id = ?", (tenant, response_id))

    def delete_session(self, session_key: str) -> int:
        with self._lock:
            self._db.execute("DELETE FROM item_ids WHERE session_key = ?", (session_key,))
            return self._db.execute("DELETE FROM response_ids WHERE session_key = ?", (session_key,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
