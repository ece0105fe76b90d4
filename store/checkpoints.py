"""Summary checkpoints (docs/architecture.md, "Summary checkpoints"): kept as versions, never overwritten.

A checkpoint covers a session's path up to its boundary event. The view of a request uses the
newest checkpoint whose boundary lies on the request's own path, so a fork picks the newest
checkpoint of its own branch and an edit before a boundary simply falls back to an older one.

Checkpoints are JSON (``checkpoints-json/``, diskcache with a JSON-only disk), never pickle:
anyone who could write a pickle into the store directory would run code in the gateway when it
is read (diskcache's default serialisation, CVE-2025-69872). A store of the pickle format
(``checkpoints/``) is converted once, when it opens (`store.checkpoints_migration`).
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import diskcache
from diskcache.core import MODE_PICKLE

from store.checkpoints_migration import read_pickled
from store.holders import holder_is_gone
from store.private import private_dir
from store.records import Checkpoint, newest_on_path

MEMO_SESSIONS = 256  # sessions whose checkpoints stay decoded in memory (LRU); the rest are read back
# SQLite under diskcache: one connection per thread that touches the store (the event loop and
# the default executor's workers), each with its own page cache. diskcache's defaults (8,192
# pages = 32 MB of cache and a 64 MB mmap per connection) would multiply with the threads.
SQLITE_CACHE_PAGES = 1024  # 4 MB of page cache per connection
SQLITE_MMAP_BYTES = 16 * 2**20
# The first copy of the WAL-index header at the start of the ``-shm`` file (sqlite.org/walformat.html,
# a format every process on the database shares): every commit, by any connection, rewrites it.
WAL_INDEX_HEADER = 48


DIRECTORY = "checkpoints-json"
_CONVERTED = ("converted", "pickle")  # set once the pickle store's checkpoints are in this one
log = logging.getLogger("palimpsest.store")


class NotJSON(ValueError):
    """A row of the checkpoint store that is not JSON (a pickle written into the directory)."""


class JSONOnlyDisk(diskcache.JSONDisk):
    """diskcache's JSONDisk that refuses to unpickle: JSONDisk writes only JSON, but it reads a
    row through `Disk`, which would unpickle one written as a pickle by someone else."""

    def get(self, key, raw):
        if not raw:
            raise NotJSON("a pickled key in the checkpoint store")
        return super().get(key, raw)

    def fetch(self, mode, filename, value, read):
        if mode == MODE_PICKLE:
            raise NotJSON("a pickled value in the checkpoint store")
        return super().fetch(mode, filename, value, read)


def _row(session_key: str, version: int) -> tuple:
    return ("cp", session_key, version)  # one checkpoint (its dict)


def _count(session_key: str) -> tuple:
    return ("cps", session_key)  # how many checkpoints the session has, versions 1..n


def _wal_index(path: Path) -> mmap.mmap | None:
    """The store's WAL-index header, mapped read-only (None without one: every look asks SQLite).
    The file lives while a connection of this process keeps the database open, as the cache's does."""
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), WAL_INDEX_HEADER, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


class DiskCheckpoints:
    """diskcache-backed checkpoints with an in-memory copy per session (read on every request).

    Layout: one row per checkpoint, keyed ``("cp", session, version)``, and the session's count
    under ``("cps", session)``, so an add writes one checkpoint whatever the session's history.
    Keys and values are JSON; the pickle store of earlier versions (either of its layouts) is
    converted when the store opens.

    Several processes may share the directory (the embedded deployment's CLI, a second gateway):
    the memo is dropped whenever another connection has committed to the store since this
    thread's connection last looked (`_fresh`, on a memo hit and in `add`), so a session deleted,
    recreated or summarised elsewhere is read afresh. Replicas share checkpoints through
    `store.postgres_checkpoints.PostgresCheckpoints`, which reads the table on every call instead."""

    blocking = False

    def __init__(self, path: str | Path, *, synchronous: str = "normal",
                 has_session: Callable[[str], bool] | None = None) -> None:
        root = private_dir(Path(path))
        # The ledger's `has_session`: a session without a ledger row has no checkpoints (a
        # checkpoint is written from the session's events, which are committed with the row
        # first, by whichever process), so a new session's first `list` skips diskcache's read.
        self._has_session = has_session
        self._cache = diskcache.Cache(
            str(private_dir(root / DIRECTORY)), disk=JSONOnlyDisk, sqlite_synchronous=2 if synchronous == "full" else 1,
            size_limit=2**62, eviction_policy="none",
            sqlite_cache_size=SQLITE_CACHE_PAGES, sqlite_mmap_size=SQLITE_MMAP_BYTES,
        )
        self._memo: OrderedDict[str, tuple[Checkpoint, ...]] = OrderedDict()
        self._memo_lock = threading.Lock()  # the loop and worker threads share the memo
        self._generation = 0  # moves at each drop: a load begun before it is not remembered
        self._looked = threading.local()  # this thread's connection and its data_version when it last looked
        self._header, self._shm = None, _wal_index(Path(self._cache.directory) / "cache.db-shm")
        self._convert(root / "checkpoints")

    def _convert(self, old: Path) -> None:
        """Move the pickle-format store of earlier versions (``checkpoints/``) into this one, in
        one transaction, then delete it. A crash before the delete converts nothing twice: the
        marker says the rows are here."""
        if not (old / "cache.db").is_file():
            return
        with self._cache.transact():
            if self._cache.get(_CONVERTED) is None:
                sessions, refused = read_pickled(old)
                for session_key, rows in sessions.items():
                    for version, raw in enumerate(rows, 1):
                        self._cache.set(_row(session_key, version), {**raw, "version": version})
                    self._cache.set(_count(session_key), len(rows))
                figures = {"sessions": len(sessions), "checkpoints": sum(map(len, sessions.values())), "refused": refused}
                self._cache.set(_CONVERTED, figures)
                log.warning("checkpoints converted from pickle to JSON", extra={"fields": figures})
        shutil.rmtree(old)

    def add(self, session_key: str, *, boundary: str, summary: str, state: dict, covered_tokens: int,
            covered_events: int, model: str, mode: str, previous: str | None, summary_tokens: int,
            meta: dict | None = None) -> Checkpoint:
        with self._cache.transact():
            # Under the write lock: no other connection commits between this look and the
            # count, so a memo that survives it holds exactly the store's checkpoints.
            generation = self._fresh()
            count = (self._get(_count(session_key)) or 0)
            version = count + 1
            cid = "cp_" + hashlib.blake2b(f"{session_key}|{boundary}|{version}".encode(), digest_size=8).hexdigest()
            cp = Checkpoint(cid, session_key, boundary, summary, state, covered_tokens, covered_events,
                            time.time(), model, version, mode, previous, summary_tokens, meta or {})
            self._cache.set(_row(session_key, version), asdict(cp))
            self._cache.set(_count(session_key), version)
            memo = self._memo.get(session_key)
            stored = memo + (cp,) if memo is not None and len(memo) == count else None
        if stored is None:
            generation, stored = self._generation, self._load(session_key)
        self._remember(session_key, stored, generation)
        return cp

    def _fresh(self) -> int:
        """Drop the memo if another connection (another process on the directory, or another
        thread of this one) committed to the store since this thread's connection last looked;
        the memo's generation after the look. The WAL-index header unchanged since the last look
        means nobody committed: a read of shared memory, no system call. Else SQLite's
        ``PRAGMA data_version`` on this thread's connection tells (~30 µs in the gateway, its
        locks' system calls): a connection's own commits leave it as it was, so this process's
        adds and leases on the event loop's connection keep the memo. A torn read of the header
        (a commit writing it) only differs: the pragma decides then."""
        header = self._shm[:WAL_INDEX_HEADER] if self._shm is not None else None
        if header is not None and header == self._header:
            return self._generation
        con = self._cache._con  # noqa: SLF001 (diskcache's connection of this thread)
        (version,) = con.execute("PRAGMA data_version").fetchone()
        looked = self._looked
        if getattr(looked, "con", None) is not con or looked.version != version:
            with self._memo_lock:
                self._memo.clear()
                self._generation += 1
            looked.con, looked.version = con, version
        self._header = header  # read before the pragma: a commit between them is looked at again
        return self._generation

    def _remember(self, session_key: str, found: tuple[Checkpoint, ...], generation: int) -> tuple[Checkpoint, ...]:
        # Bounded (least recently used out): a memo of every session ever seen would grow forever.
        with self._memo_lock:
            if generation == self._generation:  # else read before a drop: maybe stale, not kept
                self._memo[session_key] = found
                self._memo.move_to_end(session_key)
                while len(self._memo) > MEMO_SESSIONS:
                    self._memo.popitem(last=False)
        return found

    def _load(self, session_key: str) -> tuple[Checkpoint, ...]:
        # A session without checkpoints (every new session's first request) is one read, not a
        # transaction (~0.3 ms): its count is written in the same transaction as its rows.
        if not self._get(_count(session_key)):
            return ()
        with self._cache.transact():
            count = (self._get(_count(session_key)) or 0)
            raw = [self._get(_row(session_key, version)) for version in range(1, count + 1)]
        return tuple(Checkpoint(**c) for c in raw if c is not None)

    def _get(self, key: tuple):
        try:
            return self._cache.get(key)
        except NotJSON:  # planted in the directory: never decoded, the checkpoint is skipped
            log.warning("a checkpoint row is not JSON; skipped")
            return None

    def list(self, session_key: str) -> list[Checkpoint]:
        # Only a memo hit asks whether the memo still holds (a miss reads the store anyway:
        # every new session's first request goes without the look).
        found = self._memo.get(session_key)
        generation = self._fresh() if found is not None else self._generation
        if found is not None:
            found = self._memo.get(session_key)
        if found is None:
            found = self._load(session_key) if self._has_session is None or self._has_session(session_key) else ()
        return list(self._remember(session_key, found, generation))

    def newest_on_path(self, session_key: str, positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
        return newest_on_path(self.list(session_key), positions)

    def delete_session(self, session_key: str) -> int:
        """Delete every checkpoint of the session; returns how many there were."""
        with self._cache.transact():
            count = (self._get(_count(session_key)) or 0)
            for version in range(1, count + 1):
                self._cache.delete(_row(session_key, version))
            self._cache.delete(_count(session_key))
        with self._memo_lock:
            self._memo.pop(session_key, None)
        return count

    # -- leases: one summariser per session, even across processes sharing the directory ---

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take (or renew) the lease `name` for `ttl_s` seconds; False when another holds it."""
        key = f"lease:{name}"
        with self._cache.transact():
            current = self._cache.get(key)
            if current is not None and current != holder and not holder_is_gone(current):
                return False
            self._cache.set(key, holder, expire=ttl_s)
        return True

    def release_lease(self, name: str, holder: str) -> None:
        key = f"lease:{name}"
        with self._cache.transact():
            if self._cache.get(key) == holder:
                self._cache.delete(key)

    def volume_bytes(self) -> int:
        return int(self._cache.volume())

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
        self._cache.close()
