"""The ledger and checkpoints on PostgreSQL, for gateways running as several replicas.

Same semantics as the embedded store (`store.ledger.Ledger`, `store.checkpoints.DiskCheckpoints`):
content-addressed events, forks, side events, one transaction per request, client messages
committed before the upstream call. What replicas add is coordination, and all of it lives in
the database, none in a process:

- every write to a session takes a transaction-scoped advisory lock on the session
  (``pg_advisory_xact_lock``), so two replicas syncing one session serialise instead of
  racing for the same seq;
- the known-event cache is keyed by the session's epoch (its incarnation, read in the same
  transaction), so a session deleted or restarted through another replica never hits it;
- checkpoints are read from the table on every call (no memo to go stale), and ``add`` refuses a
  second checkpoint for a boundary the session already has;
- leases (`acquire_lease`) with an expiry on the database's clock: exactly one replica
  summarises a session at a time, and a holder that dies frees it when the lease runs out.

The driver is psycopg 3 with a connection pool. Its calls block, so these classes say
``blocking = True`` and the gateway runs them in worker threads (`store.call`), never on the
event loop. The schema is versioned (`store.migrations`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
import time
from collections import OrderedDict
from typing import Iterable

import orjson
from psycopg_pool import ConnectionPool

from store.canonical import event_id, path_ids, stored_form
from store.ledger import SEEN_CACHE, event_row, new_epoch, side_event_rows
from store.records import Event, PathSync, SessionRecord, SessionRef
from store.interfaces import on_event_loop
from store.postgres_pool import lock_key, open_pool

log = logging.getLogger("palimpsest.ledger")
_EVENT_COLUMNS = "id, parent, seq, role, message, created, kind"
_SESSION_COLUMNS = "key, tenant, session_id, created, updated, events, head, requests, model"


def _event(row) -> Event:
    return Event(row[0], row[1], row[2], row[3], orjson.loads(row[4]), row[5], row[6])


class PostgresLedger:
    """`store.ledger.Ledger`'s interface and semantics on a PostgreSQL database."""

    blocking = True

    def __init__(self, url: str | None = None, *, pool: ConnectionPool | None = None, max_connections: int = 10) -> None:
        self._owns_pool = pool is None
        self._pool = pool or open_pool(url or "", max_size=max_connections)
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._seen_lock = threading.Lock()
        self._epochs: dict[str, str] = {}  # session -> the epoch this process saw last (picks what to probe)
        # Writes whose result the caller does not need (the answer, recall side events), made
        # on the event loop's thread, go to this one writer thread in order (`_behind`).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-ledger-writer")
        self._inflight: set[Future] = set()

    @property
    def pool(self) -> ConnectionPool:
        return self._pool

    # -- writing ---------------------------------------------------------------------------

    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None, model: str | None = None) -> PathSync:
        """Two round trips: (lock, session row, which ids exist) then (writes, commit)."""
        sk = ref.key
        if ids is None:
            ids = path_ids(messages)
        if not ids:
            return PathSync(ids, 0)
        with self._pool.connection() as conn:
            last = self._epochs.get(sk)
            probe = [i for i in ids if not self._cached(sk, last, i)] if last is not None else list(ids)
            seq, epoch, exists, rows_found = self._open(conn, ref, probe, "id")
            found = {r[0] for r in rows_found}
            if exists and last is not None and epoch != last:
                found = self._known(conn, sk, epoch, ids)  # the session was started again elsewhere: ask anew
            if len(self._epochs) > SEEN_CACHE:
                self._epochs.clear()  # only picks what to probe: forgetting costs one wider query
            self._epochs[sk] = epoch
            for eid in found:
                self._remember((sk, epoch, eid))
            if exists and (ids[-1] in found or self._cached(sk, epoch, ids[-1])):
                with conn.pipeline():
                    conn.execute("UPDATE sessions SET requests = requests + 1, model = %s WHERE key = %s", (model, sk))
                    conn.commit()
                return PathSync(ids, 0)
            first_new = len(ids) - 1
            while first_new > 0 and not (ids[first_new - 1] in found or self._cached(sk, epoch, ids[first_new - 1])):
                first_new -= 1
            now = time.time()
            rows = [
                event_row(sk, ids[i - 1] if i else None, ids[i], seq + n, messages[i], "message", now)
                for n, i in enumerate(range(first_new, len(ids)))
            ]
            with conn.pipeline():
                if not exists:
                    self._create_session(conn, ref, epoch, now)
                with conn.cursor() as cur:
                    cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
                conn.execute(
                    "UPDATE sessions SET events = events + %s, head = %s, updated = %s, requests = requests + 1, model = %s WHERE key = %s",
                    (len(rows), ids[-1], now, model, sk),
                )
                conn.commit()
        for row in rows:
            self._remember((sk, epoch, row[1]))
        return PathSync(ids, len(rows))

    def append(self, ref: SessionRef, parent: str | None, message: dict, *, defer: bool = False) -> Event:
        """Record the upstream's answer as the child of `parent`; always committed now (`defer`
        is accepted for interface parity: replicas share no memory to defer into)."""
        eid = event_id(parent, message)
        if on_event_loop():
            self._behind(self._append_now, ref, parent, eid, message)
            return Event(eid, parent, -1, str(message.get("role")), stored_form(message), time.time())
        return self._append_now(ref, parent, eid, message)

    def _append_now(self, ref: SessionRef, parent: str | None, eid: str, message: dict) -> Event:
        """Two round trips: (lock, session row, the event if it exists) then (writes, commit)."""
        with self._pool.connection() as conn:
            seq, epoch, exists, rows_found = self._open(conn, ref, [eid], _EVENT_COLUMNS)
            self._epochs[ref.key] = epoch
            if rows_found:
                self._remember((ref.key, epoch, eid))
                return _event(rows_found[0])
            now = time.time()
            row = event_row(ref.key, parent, eid, seq, message, "message", now)
            with conn.pipeline():
                if not exists:
                    self._create_session(conn, ref, epoch, now)
                conn.execute("INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", row)
                conn.execute("UPDATE sessions SET events = events + 1, head = %s, updated = %s WHERE key = %s", (eid, now, ref.key))
                conn.commit()
        self._remember((ref.key, epoch, eid))
        return Event(eid, parent, seq, row[4], orjson.loads(row[7]), now)

    def _open(self, conn, ref: SessionRef, probe: list[str], columns: str) -> tuple[int, str, bool, list]:
        """One round trip: lock the session until commit (writers serialise), read its next seq
        and epoch, and the rows of the `probe` ids that exist. A missing session gets a fresh
        epoch; the caller creates its row with its writes (`_create_session`)."""
        with conn.pipeline():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(ref.key),))
            session = conn.execute("SELECT events, epoch FROM sessions WHERE key = %s", (ref.key,))
            events = conn.execute(f"SELECT {columns} FROM events WHERE session_key = %s AND id = ANY(%s)", (ref.key, probe)) if probe else None
            row = session.fetchone()
            found = events.fetchall() if events is not None else []
        if row is None:
            return 0, new_epoch(), False, []
        return row[0], row[1], True, found

    @staticmethod
    def _create_session(conn, ref: SessionRef, epoch: str, now: float) -> None:
        conn.execute(
            "INSERT INTO sessions (key, tenant, session_id, created, updated, epoch) VALUES (%s, %s, %s, %s, %s, %s)",
            (ref.key, ref.tenant, ref.session_id, now, now, epoch),
        )

    def flush(self) -> None:
        """Wait for the writes handed to the writer thread (reads do: read your own writes)."""
        if not self._inflight or threading.current_thread().name.startswith("pg-ledger-writer"):
            return
        for future in list(self._inflight):
            try:
                future.result()
            except Exception:
                pass  # logged by _done

    def _behind(self, fn, *args) -> None:
        """Commit on the writer thread, starting now: the event loop does not wait for the round
        trips, and the write is durable about a millisecond later (docs/architecture.md)."""
        future = self._writer.submit(fn, *args)
        self._inflight.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        self._inflight.discard(future)
        if future.exception() is not None:
            log.error("ledger write failed", exc_info=future.exception())

    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]:
        """Gateway-made messages hung off `node`. Called on the event loop it returns [] at once
        and commits on the writer thread (callers there do not use the events)."""
        messages = list(messages)
        if on_event_loop():
            self._behind(self._add_side_events_now, ref, node, messages)
            return []
        return self._add_side_events_now(ref, node, messages)

    def _add_side_events_now(self, ref: SessionRef, node: str | None, messages: list[dict]) -> list[Event]:
        out = []
        with self._pool.connection() as conn:
            seq, _ = self._lock_session(conn, ref)
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM events WHERE session_key = %s AND parent IS NOT DISTINCT FROM %s AND kind = 'side'", (ref.key, node)
            ).fetchone()
            now = time.time()
            rows = side_event_rows(ref.key, node, count, seq, messages, now)
            out = [row[1] for row in rows]
            if rows:
                with conn.cursor() as cur:
                    cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", rows)
                conn.execute("UPDATE sessions SET events = events + %s, updated = %s WHERE key = %s", (len(rows), now, ref.key))
        return self.get_many(ref.key, out)

    def _lock_session(self, conn, ref: SessionRef) -> tuple[int, str]:
        """Serialise writers of the session (until commit); its next seq and epoch."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(ref.key),))
        row = conn.execute("SELECT events, epoch FROM sessions WHERE key = %s", (ref.key,)).fetchone()
        if row is not None:
            return row[0], row[1]
        now, epoch = time.time(), new_epoch()
        conn.execute(
            "INSERT INTO sessions (key, tenant, session_id, created, updated, epoch) VALUES (%s, %s, %s, %s, %s, %s)",
            (ref.key, ref.tenant, ref.session_id, now, now, epoch),
        )
        return 0, epoch

    def _cached(self, sk: str, epoch: str, eid: str) -> bool:
        with self._seen_lock:
            return (sk, epoch, eid) in self._seen

    def _known(self, conn, sk: str, epoch: str, ids: list[str]) -> set[str]:
        """Which of `ids` exist in the session: cached ones, plus one query for the rest."""
        with self._seen_lock:
            known = {i for i in ids if (sk, epoch, i) in self._seen}
        rest = [i for i in ids if i not in known]
        if rest:
            rows = conn.execute("SELECT id FROM events WHERE session_key = %s AND id = ANY(%s)", (sk, rest)).fetchall()
            for (eid,) in rows:
                known.add(eid)
                self._remember((sk, epoch, eid))
        return known

    def _remember(self, key: tuple[str, str, str]) -> None:
        with self._seen_lock:
            self._seen[key] = None
            if len(self._seen) > SEEN_CACHE:
                self._seen.popitem(last=False)

    # -- reading ---------------------------------------------------------------------------

    def _one(self, query: str, args: tuple):
        self.flush()
        with self._pool.connection() as conn:
            return conn.execute(query, args).fetchone()

    def _all(self, query: str, args: tuple = ()):
        self.flush()
        with self._pool.connection() as conn:
            return conn.execute(query, args).fetchall()

    def holds(self, session_key: str, eid: str, *, cached: bool = True) -> bool:  # no cache here: always looks
        return self._one("SELECT 1 FROM events WHERE session_key = %s AND id = %s", (session_key, eid)) is not None

    def get(self, session_key: str, eid: str) -> Event | None:
        row = self._one(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = %s AND id = %s", (session_key, eid))
        return _event(row) if row is not None else None

    def get_many(self, session_key: str, ids: Iterable[str]) -> list[Event]:
        wanted = list(ids)
        if not wanted:
            return []
        rows = self._all(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = %s AND id = ANY(%s)", (session_key, wanted))
        found = {r[0]: _event(r) for r in rows}
        return [found[i] for i in wanted if i in found]

    def since(self, session_key: str, seq: int) -> list[Event]:
        rows = self._all(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = %s AND seq > %s ORDER BY seq", (session_key, seq))
        return [_event(r) for r in rows]

    def children(self, session_key: str, eid: str | None) -> tuple[str, ...]:
        rows = self._all(
            "SELECT id FROM events WHERE session_key = %s AND parent IS NOT DISTINCT FROM %s AND kind = 'message' ORDER BY seq",
            (session_key, eid),
        )
        return tuple(r[0] for r in rows)

    def side_events(self, session_key: str, node: str | None) -> list[Event]:
        rows = self._all(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_key = %s AND parent IS NOT DISTINCT FROM %s AND kind = 'side' ORDER BY seq",
            (session_key, node),
        )
        return [_event(r) for r in rows]

    def path_to(self, session_key: str, eid: str) -> list[Event]:
        """The path from the root to `eid`, in one query (a recursive walk up the parents)."""
        rows = self._all(
            f"""WITH RECURSIVE up AS (
                    SELECT {_EVENT_COLUMNS}, 0 AS depth FROM events WHERE session_key = %s AND id = %s
                    UNION ALL
                    SELECT e.id, e.parent, e.seq, e.role, e.message, e.created, e.kind, up.depth + 1
                    FROM events e JOIN up ON e.session_key = %s AND e.id = up.parent)
                SELECT {_EVENT_COLUMNS} FROM up ORDER BY depth DESC""",
            (session_key, eid, session_key),
        )
        return [_event(r) for r in rows]

    def heads(self, session_key: str) -> list[str]:
        rows = self._all(
            """SELECT e.id FROM events e WHERE e.session_key = %s AND e.kind = 'message' AND NOT EXISTS (
                   SELECT 1 FROM events c WHERE c.session_key = e.session_key AND c.parent = e.id AND c.kind = 'message')
               ORDER BY e.seq""",
            (session_key,),
        )
        return [r[0] for r in rows]

    def session(self, session_key: str) -> SessionRecord | None:
        row = self._one(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = %s", (session_key,))
        return SessionRecord(*row) if row else None

    def sessions(self, tenant: str | None = None) -> list[SessionRecord]:
        query = f"SELECT {_SESSION_COLUMNS} FROM sessions"
        rows = (self._all(query + " WHERE tenant = %s ORDER BY updated DESC", (tenant,)) if tenant is not None
                else self._all(query + " ORDER BY updated DESC"))
        return [SessionRecord(*r) for r in rows]

    def session_count(self) -> int:
        return self._one("SELECT COUNT(*) FROM sessions", ())[0]

    def tenant_bytes(self, tenant: str) -> int:
        row = self._one("SELECT COALESCE(SUM(octet_length(message)), 0) FROM events WHERE session_key >= %s AND session_key < %s",
                        (tenant + "/", tenant + "0"))
        return int(row[0] or 0)

    def volume_bytes(self) -> int:
        row = self._one("SELECT pg_total_relation_size('events') + pg_total_relation_size('sessions')", ())
        return int(row[0] or 0)

    def ping(self) -> None:
        """Raises when the database cannot be reached (the readiness probe)."""
        self._one("SELECT 1", ())

    # -- lifecycle -------------------------------------------------------------------------

    def delete_session(self, session_key: str) -> int:
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(session_key),))
            deleted = conn.execute("DELETE FROM events WHERE session_key = %s", (session_key,)).rowcount
            conn.execute("DELETE FROM sessions WHERE key = %s", (session_key,))
        return deleted

    def expired(self, before: float) -> list[str]:
        return [r[0] for r in self._all("SELECT key FROM sessions WHERE updated < %s ORDER BY updated", (before,))]

    def checkpoint(self) -> None:
        """Nothing to do: PostgreSQL checkpoints its own WAL."""

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)
        if self._owns_pool:
            self._pool.close()




