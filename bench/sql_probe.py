"""A warm transaction timed right after a COMMIT (no project imports, so a bench that puts
another tree on ``sys.path`` can import it first): what the ledger's statements cost without
the cold start that follows the request's other work (bench/README.md, lat9)."""

from __future__ import annotations

import time

PROBE = (("BEGIN IMMEDIATE", ()), ("UPDATE sessions SET updated = updated WHERE key = ?", None), ("COMMIT", ()))


def probe_after_commit(db, times: dict[str, list[float]]) -> None:
    """One no-op update of the newest session, each statement timed into ``times``."""
    row = db.execute("SELECT key FROM sessions ORDER BY updated DESC LIMIT 1").fetchone()
    for sql, args in PROBE:
        started = time.perf_counter()
        db.execute(sql, row if args is None else args)
        times[f"probe after a COMMIT: {sql[:30]}"].append(time.perf_counter() - started)


class WrappedConnection:
    """A sqlite3 connection whose ``execute`` / ``executemany`` go through ``_timed`` (the
    subclass's timing); everything else is the connection's own."""

    def __init__(self, db) -> None:
        self._db = db

    def _timed(self, method, sql: str, *args):
        return method(sql, *args)

    def execute(self, sql, *args):
        return self._timed(self._db.execute, sql, *args)

    def executemany(self, sql, *args):
        return self._timed(self._db.executemany, sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)
