"""Response ids and the compaction-item secret on PostgreSQL (see `store.response_ids`).

The same table as the embedded store, keyed by (tenant, id), in the database every replica
shares: a ``previous_response_id`` or a compaction item made through one replica is continued,
read, deleted or expanded through any other. The secret is made by whichever replica asks
first (``ON CONFLICT DO NOTHING``) and read back, so all replicas seal and open items alike.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from psycopg_pool import ConnectionPool

from store.postgres_pool import open_pool
from store.response_ids import SECRET_NAME, RecordedResponse, owners_of


class PostgresResponseIds:
    """``store.interfaces.ResponseIdStore`` in PostgreSQL."""

    blocking = True

    def __init__(self, url: str | None = None, *, pool: ConnectionPool | None = None) -> None:
        self._owns_pool = pool is None
        self._pool = pool or open_pool(url or "")

    def secret(self) -> bytes:
        with self._pool.connection() as conn:
            conn.execute("INSERT INTO secrets VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                         (SECRET_NAME, secrets.token_bytes(32)))
            (value,) = conn.execute("SELECT value FROM secrets WHERE name = %s", (SECRET_NAME,)).fetchone()
        return bytes(value)

    def remember(self, tenant: str, response_id: str, session_key: str, event_id: str,
                 items: Sequence[str] = ()) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO response_ids VALUES (%s, %s, %s, %s, %s, false) ON CONFLICT (tenant, id) DO UPDATE SET "
                "session_key = EXCLUDED.session_key, event_id = EXCLUDED.event_id, created = EXCLUDED.created, deleted = false",
                (tenant, response_id, session_key, event_id, time.time()))
            if items:
                conn.cursor().executemany(
                    "INSERT INTO item_ids VALUES (%s, %s, %s) ON CONFLICT (tenant, id) DO UPDATE SET session_key = EXCLUDED.session_key",
                    [(tenant, i, session_key) for i in items])

    def item_owners(self, item_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        wanted = list(dict.fromkeys(item_ids))
        if not wanted:
            return {}
        with self._pool.connection() as conn:
            return owners_of(conn.execute("SELECT id, tenant FROM item_ids WHERE id = ANY(%s)", (wanted,)).fetchall())

    def find(self, tenant: str, response_id: str) -> RecordedResponse | None:
        with self._pool.connection() as conn:
            row = conn.execute(
                "SELECT tenant, id, session_key, event_id, created FROM response_ids WHERE tenant = %s AND id = %s AND NOT deleted",
                (tenant, response_id)).fetchone()
        return RecordedResponse(*row) if row else None

    def taken(self, response_id: str) -> bool:
        with self._pool.connection() as conn:
            return conn.execute("SELECT 1 FROM response_ids WHERE id = %s AND NOT deleted LIMIT 1",
                                (response_id,)).fetchone() is not None

    def forget(self, tenant: str, response_id: str) -> None:
        with self._pool.connection() as conn:
            conn.execute("UPDATE response_ids SET deleted = true WHERE tenant = %s AND id = %s", (tenant, response_id))

    def delete_session(self, session_key: str) -> int:
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM item_ids WHERE session_key = %s", (session_key,))
            return conn.execute("DELETE FROM response_ids WHERE session_key = %s", (session_key,)).rowcount

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()
