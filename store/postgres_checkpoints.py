"""Summary checkpoints and leases on PostgreSQL (see `store.postgres` for the ledger).

Checkpoints are versions per session, read from the table on every call: a replica sees what
another wrote at once (the embedded store's per-process memo would go stale). `add` serialises
per session on an advisory lock and refuses a second checkpoint for a boundary the session
already has. Leases carry their expiry on the database's clock, so replicas' clocks may differ.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict

import orjson
from psycopg_pool import ConnectionPool

from store.records import Checkpoint, newest_on_path
from store.postgres_pool import lock_key, open_pool


class PostgresCheckpoints:
    """Checkpoints in PostgreSQL: versions per session, read fresh on every call."""

    blocking = True

    def __init__(self, url: str | None = None, *, pool: ConnectionPool | None = None) -> None:
        self._owns_pool = pool is None
        self._pool = pool or open_pool(url or "")

    def add(self, session_key: str, *, boundary: str, summary: str, state: dict, covered_tokens: int,
            covered_events: int, model: str, mode: str, previous: str | None, summary_tokens: int,
            meta: dict | None = None) -> Checkpoint:
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("checkpoints:" + session_key),))
            same = conn.execute(
                "SELECT body FROM checkpoints WHERE session_key = %s AND boundary = %s ORDER BY version DESC LIMIT 1",
                (session_key, boundary),
            ).fetchone()
            if same is not None:  # another replica covered this boundary already: one checkpoint per boundary
                return Checkpoint(**orjson.loads(same[0]))
            (count,) = conn.execute("SELECT COUNT(*) FROM checkpoints WHERE session_key = %s", (session_key,)).fetchone()
            version = count + 1
            cid = "cp_" + hashlib.blake2b(f"{session_key}|{boundary}|{version}".encode(), digest_size=8).hexdigest()
            cp = Checkpoint(cid, session_key, boundary, summary, state, covered_tokens, covered_events,
                            time.time(), model, version, mode, previous, summary_tokens, meta or {})
            conn.execute("INSERT INTO checkpoints VALUES (%s, %s, %s, %s, %s)",
                         (session_key, version, cid, boundary, orjson.dumps(asdict(cp))))
        return cp

    def list(self, session_key: str) -> list[Checkpoint]:
        with self._pool.connection() as conn:
            rows = conn.execute("SELECT body FROM checkpoints WHERE session_key = %s ORDER BY version", (session_key,)).fetchall()
        return [Checkpoint(**orjson.loads(r[0])) for r in rows]

    def newest_on_path(self, session_key: str, positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
        return newest_on_path(self.list(session_key), positions)

    def delete_session(self, session_key: str) -> int:
        with self._pool.connection() as conn:
            return conn.execute("DELETE FROM checkpoints WHERE session_key = %s", (session_key,)).rowcount

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease `name` for `ttl_s` seconds of the database's clock."""
        with self._pool.connection() as conn:
            row = conn.execute(
                """INSERT INTO leases (name, holder, expires)
                   VALUES (%s, %s, extract(epoch FROM clock_timestamp()) + %s)
                   ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires = EXCLUDED.expires
                   WHERE leases.holder = EXCLUDED.holder OR leases.expires < extract(epoch FROM clock_timestamp())
                   RETURNING holder""",
                (name, holder, ttl_s),
            ).fetchone()
        return row is not None

    def release_lease(self, name: str, holder: str) -> None:
        with self._pool.connection() as conn:
            conn.execute("DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder))

    def volume_bytes(self) -> int:
        with self._pool.connection() as conn:
            return int(conn.execute("SELECT pg_total_relation_size('checkpoints')").fetchone()[0] or 0)

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()
