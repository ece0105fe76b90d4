"""The turn log: what each answered request was built on (docs/architecture.md, "Inspection").

One row per answered request: the model, the context window and budget its view was fitted to,
the client's and the upstream's prompt tokens, the checkpoint in the view and the recall calls,
keyed by the session and the request's last message (the node its answer hangs off). The
inspector (``palimpsest inspect``, the admin API) reads these instead of asking the upstream for
windows or re-projecting every past request, so it shows what the live gateway used.

The embedded backend is its own small SQLite file (``turns.sqlite3`` under ``store.path``), kept
apart from the ledger so recording never touches the ledger's transactions or its events. Rows
are buffered in memory and written in one transaction by ``flush`` (the app calls it every
~0.5 s and on close), so the request path only appends to a list.

A row also keeps what of its request the ledger does not hold (the client's system prompt,
instructions, tools and parameters: ``gateway/pipeline/request_form.py``), so ``palimpsest
replay`` can rebuild the request; its large values are the session's *request parts*, kept once
per session by content address. They are conversation text: they live in this file (private to
the gateway's user, store/private.py), never in a log, and go with the session.

The same file keeps each request's receipt (``gateway/ops/receipts.py``): a JSON document under
a random id, with the tenant that may read it. Receipts go when their session goes (deletion,
the retention sweep), so they live exactly as long as the session's retention.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    session_key     TEXT NOT NULL,
    node            TEXT,
    answer          TEXT,
    created         REAL NOT NULL,
    model           TEXT NOT NULL,
    window          INTEGER NOT NULL,
    budget          INTEGER NOT NULL,
    client_tokens   INTEGER NOT NULL,
    upstream_tokens INTEGER NOT NULL,
    checkpoint      TEXT,
    recall_calls    INTEGER NOT NULL DEFAULT 0,
    cached_tokens   INTEGER,
    uncached_tokens INTEGER,
    cache_write_tokens INTEGER,
    cost_usd        REAL
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session_key, created);
CREATE TABLE IF NOT EXISTS receipts (
    id          TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    created     REAL NOT NULL,
    body        BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_by_session ON receipts (session_key);
CREATE TABLE IF NOT EXISTS request_parts (
    session_key TEXT NOT NULL,
    digest      TEXT NOT NULL,
    body        BLOB NOT NULL,
    PRIMARY KEY (session_key, digest)
);
"""


@dataclass(frozen=True, slots=True)
class TurnBasis:
    """What one answered request was built on."""

    session_key: str
    node: str | None  # the request's last message: its answer is this event's child
    answer: str | None  # the answer's event id
    model: str
    window: int
    budget: int
    client_tokens: int
    upstream_tokens: int
    checkpoint: str | None = None
    recall_calls: int = 0
    # What the provider said it billed over the request's upstream calls (None: not reported).
    cached_tokens: int | None = None
    uncached_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost_usd: float | None = None  # None: the model's price is not known
    receipt: str | None = None  # the request's receipt id (x-palimpsest-receipt)
    compaction_event: bool = False  # the view plan rewrote the prompt prefix at this request
    billed_units: float | None = None  # the request's upstream calls in uncached-input-token units
    route: str | None = None  # the wire format the client spoke: chat, responses, messages
    # What of the request the ledger does not hold (gateway/pipeline/request_form.py), its large
    # values by content address in the session's request parts (`add_parts`); None: not recorded.
    form: str | None = None
    created: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """One request's receipt as stored: its JSON body and whose it is."""

    id: str
    session_key: str
    tenant: str
    body: bytes
    created: float = field(default_factory=time.time)


_COLUMNS = ("session_key", "node", "answer", "created", "model", "window", "budget", "client_tokens",
            "upstream_tokens", "checkpoint", "recall_calls", "cached_tokens", "uncached_tokens",
            "cache_write_tokens", "cost_usd", "receipt", "compaction_event", "billed_units", "route", "form")
# Columns added after the first schema: a turn log written before them gains them on open.
_ADDED = {"cached_tokens": "INTEGER", "uncached_tokens": "INTEGER", "cache_write_tokens": "INTEGER", "cost_usd": "REAL",
          "receipt": "TEXT", "compaction_event": "INTEGER NOT NULL DEFAULT 0", "billed_units": "REAL",
          "route": "TEXT", "form": "TEXT"}


def _row(basis: TurnBasis) -> tuple:
    return tuple(getattr(basis, c) for c in _COLUMNS)  # not astuple: it deep-copies every field


class TurnLog:
    """SQLite-backed turn log; `add` buffers, `flush` writes."""

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._path = root / "turns.sqlite3"
        self._db = sqlite3.connect(str(self._path), timeout=10, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        have = {row[1] for row in self._db.execute("PRAGMA table_info(turns)")}
        for column, kind in _ADDED.items():
            if column not in have:
                self._db.execute(f"ALTER TABLE turns ADD COLUMN {column} {kind}")
        # Appended on the event loop, drained by `flush` in a worker thread: deque's append and
        # popleft are atomic, so nothing added while a flush runs is lost.
        self._pending: deque[TurnBasis] = deque()
        self._receipts: deque[StoredReceipt] = deque()
        self._parts: deque[tuple[str, str, bytes]] = deque()  # (session key, digest, body)
        self._lock = threading.Lock()

    def add(self, basis: TurnBasis) -> None:
        """Remember one request's basis; it reaches the disk with the next `flush`."""
        self._pending.append(basis)

    def add_receipt(self, receipt: StoredReceipt) -> None:
        """Remember one request's receipt; it reaches the disk with the next `flush`."""
        self._receipts.append(receipt)

    def add_parts(self, session_key: str, parts: dict[str, bytes]) -> None:
        """Remember the session's request parts (content-addressed: a part already kept is kept
        once); they reach the disk with the next `flush`."""
        for digest, body in parts.items():
            self._parts.append((session_key, digest, body))

    def parts(self, session_key: str) -> dict[str, bytes]:
        """Every request part of the session, by content address."""
        self.flush()
        rows = self._db.execute("SELECT digest, body FROM request_parts WHERE session_key = ?", (session_key,))
        return {digest: bytes(body) for digest, body in rows}

    def receipt(self, receipt_id: str) -> StoredReceipt | None:
        self.flush()
        row = self._db.execute("SELECT id, session_key, tenant, body, created FROM receipts WHERE id = ?",
                               (receipt_id,)).fetchone()
        return StoredReceipt(row[0], row[1], row[2], bytes(row[3]), row[4]) if row else None

    def flush(self) -> None:
        with self._lock:
            pending, receipts = _drain(self._pending), _drain(self._receipts)
            parts = {(key, digest): body for key, digest, body in _drain(self._parts)}  # a part once
            if not pending and not receipts and not parts:
                return
            cols = ", ".join(_COLUMNS)
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(f"INSERT INTO turns ({cols}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                                     [_row(b) for b in pending])
                self._db.executemany("INSERT OR REPLACE INTO receipts (id, session_key, tenant, created, body) "
                                     "VALUES (?, ?, ?, ?, ?)",
                                     [(r.id, r.session_key, r.tenant, r.created, r.body) for r in receipts])
                self._db.executemany("INSERT OR IGNORE INTO request_parts (session_key, digest, body) VALUES (?, ?, ?)",
                                     [(key, digest, body) for (key, digest), body in parts.items()])

    def session(self, session_key: str) -> list[TurnBasis]:
        """Every recorded request of the session, oldest first."""
        self.flush()
        rows = self._db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM turns WHERE session_key = ? ORDER BY created", (session_key,)
        ).fetchall()
        at = _COLUMNS.index("compaction_event")
        return [TurnBasis(**{**dict(zip(_COLUMNS, row)), "compaction_event": bool(row[at])}) for row in rows]

    def delete_session(self, session_key: str) -> int:
        """Delete the session's rows and its receipts; the number of rows deleted."""
        self.flush()
        with self._db:
            self._db.execute("DELETE FROM receipts WHERE session_key = ?", (session_key,))
            self._db.execute("DELETE FROM request_parts WHERE session_key = ?", (session_key,))
            return self._db.execute("DELETE FROM turns WHERE session_key = ?", (session_key,)).rowcount

    def close(self) -> None:
        self.flush()
        self._db.close()


def _drain(queue: deque) -> list:
    out = []
    while queue:
        out.append(queue.popleft())
    return out
