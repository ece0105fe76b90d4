"""Versioned schema migrations for the ledger, embedded (SQLite) and PostgreSQL.

Each backend has an ordered list of steps; a store records the version it is at and opening it
applies the steps above that version, in one transaction each, so a store written by an older
gateway opens with a newer one (and a newer store refuses to open with an older gateway rather
than being written with a schema it does not know).

SQLite keeps the version in ``PRAGMA user_version``. Version 1 is the schema the gateway wrote
before versioning existed (``user_version`` 0 with the tables present); an empty file goes
straight to the newest version. PostgreSQL keeps it in a ``schema_version`` table, and replicas
starting together serialise on an advisory lock so exactly one applies each step.
"""

from __future__ import annotations

import sqlite3

# -- SQLite ------------------------------------------------------------------------------------

_SQLITE_V1 = """
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

# v2: sessions can be deleted, so a session key may come back as a new session. `epoch` names
# the incarnation; caches of "this event exists" are keyed by it (never stale after a delete).
_SQLITE_V2 = """
ALTER TABLE sessions ADD COLUMN epoch TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated);
"""

SQLITE_STEPS: list[tuple[int, str]] = [(1, _SQLITE_V1), (2, _SQLITE_V2)]
SQLITE_VERSION = SQLITE_STEPS[-1][0]


class SchemaTooNew(RuntimeError):
    """The store was written by a newer gateway."""


def migrate_sqlite(db: sqlite3.Connection) -> int:
    """Bring the ledger database to `SQLITE_VERSION`; returns the version it was at."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version == 0 and db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sessions'").fetchone():
        version = 1  # written before versioning existed: that schema is version 1
        db.execute("PRAGMA user_version = 1")
    if version > SQLITE_VERSION:
        raise SchemaTooNew(f"ledger schema version {version} is newer than this gateway's ({SQLITE_VERSION})")
    start = version
    for step, script in SQLITE_STEPS:
        if step <= version:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            (current,) = db.execute("PRAGMA user_version").fetchone()
            if current < step:  # another process may have migrated meanwhile
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {step}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        version = step
    return start


# -- PostgreSQL --------------------------------------------------------------------------------

_PG_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
    key        TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    created    DOUBLE PRECISION NOT NULL,
    updated    DOUBLE PRECISION NOT NULL,
    events     INTEGER NOT NULL DEFAULT 0,
    head       TEXT,
    requests   INTEGER NOT NULL DEFAULT 0,
    model      TEXT,
    epoch      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, updated);
CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated);
CREATE TABLE IF NOT EXISTS events (
    session_key TEXT NOT NULL,
    id          TEXT NOT NULL,
    parent      TEXT,
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    created     DOUBLE PRECISION NOT NULL,
    message     BYTEA NOT NULL,
    PRIMARY KEY (session_key, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_seq ON events (session_key, seq);
CREATE INDEX IF NOT EXISTS events_by_parent ON events (session_key, parent, kind);
CREATE TABLE IF NOT EXISTS checkpoints (
    session_key TEXT NOT NULL,
    version     INTEGER NOT NULL,
    id          TEXT NOT NULL,
    boundary    TEXT NOT NULL,
    body        BYTEA NOT NULL,
    PRIMARY KEY (session_key, version)
);
CREATE TABLE IF NOT EXISTS leases (
    name    TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    expires DOUBLE PRECISION NOT NULL
);
"""

# v2: Responses API ids per tenant and the compaction-item secret, shared by replicas
# (store.postgres_responses; the embedded store keeps them in responses.sqlite3).
_PG_V2 = """
CREATE TABLE IF NOT EXISTS response_ids (
    tenant      TEXT NOT NULL,
    id          TEXT NOT NULL,
    session_key TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    created     DOUBLE PRECISION NOT NULL,
    deleted     BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS response_ids_by_session ON response_ids (session_key);
CREATE INDEX IF NOT EXISTS response_ids_by_id ON response_ids (id);
CREATE TABLE IF NOT EXISTS secrets (
    name  TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
"""

# v3: the ids of recorded answers' output items per tenant (whose an item_reference is).
_PG_V3 = """
CREATE TABLE IF NOT EXISTS item_ids (
    tenant      TEXT NOT NULL,
    id          TEXT NOT NULL,
    session_key TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS item_ids_by_session ON item_ids (session_key);
CREATE INDEX IF NOT EXISTS item_ids_by_id ON item_ids (id);
"""

PG_STEPS: list[tuple[int, str]] = [(1, _PG_V1), (2, _PG_V2), (3, _PG_V3)]
PG_VERSION = PG_STEPS[-1][0]
_PG_MIGRATION_LOCK = 0x50A11  # advisory lock key: one replica migrates at a time


def migrate_postgres(conn) -> int:
    """Bring a PostgreSQL database to `PG_VERSION` (a psycopg connection, autocommit off)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        start = version = row[0] or 0
        if version > PG_VERSION:
            raise SchemaTooNew(f"ledger schema version {version} is newer than this gateway's ({PG_VERSION})")
        for step, script in PG_STEPS:
            if step <= version:
                continue
            conn.execute(script)
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step,))
            version = step
    return start
