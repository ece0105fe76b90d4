"""Summary checkpoints (docs/architecture.md, "Summary checkpoints"): kept as versions, never overwritten.

A checkpoint covers a session's path up to its boundary event. The view of a request uses the
newest checkpoint whose boundary lies on the request's own path, so a fork picks the newest
checkpoint of its own branch and an edit before a boundary simply falls back to an older one.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path
import diskcache

from store.holders import holder_is_gone
from store.records import Checkpoint, newest_on_path

MEMO_SESSIONS = 256  # sessions whose checkpoints stay decoded in memory (LRU); the rest are read back
# SQLite under diskcache: one connection per thread that touches the store (the event loop and
# the default executor's workers), each with its own page cache. diskcache's defaults (8,192
# pages = 32 MB of cache and a 64 MB mmap per connection) would multiply with the threads.
SQLITE_CACHE_PAGES = 1024  # 4 MB of page cache per connection
SQLITE_MMAP_BYTES = 16 * 2**20


def _row(session_key: str, version: int) -> tuple:
    return ("cp", session_key, version)  # one checkpoint (its dict)


def _count(session_key: str) -> tuple:
    return ("cps", session_key)  # how many checkpoints the session has, versions 1..n


class DiskCheckpoints:
    """diskcache-backed checkpoints with an in-memory copy per session (read on every request).

    Layout: one row per checkpoint, keyed ``("cp", session, version)``, and the session's count
    under ``("cps", session)``, so an add writes one checkpoint whatever the session's history
    (the previous layout rewrote the session's whole tuple on every add: bytes written grew
    with each checkpoint). A store of the previous layout (``session -> tuple of dicts``) still
    reads; a session's first add moves its tuple to rows.

    The memo is only valid while this process is the store's one writer: that is the embedded
    deployment. Replicas share checkpoints through `store.postgres_checkpoints.PostgresCheckpoints`,
    which reads the table on every call instead."""

    blocking = False

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._cache = diskcache.Cache(
            str(root / "checkpoints"), sqlite_synchronous=2 if synchronous == "full" else 1,
            size_limit=2**62, eviction_policy="none",
            sqlite_cache_size=SQLITE_CACHE_PAGES, sqlite_mmap_size=SQLITE_MMAP_BYTES,
        )
        self._memo: OrderedDict[str, tuple[Checkpoint, ...]] = OrderedDict()

    def add(self, session_key: str, *, boundary: str, summary: str, state: dict, covered_tokens: int,
            covered_events: int, model: str, mode: str, previous: str | None, summary_tokens: int,
            meta: dict | None = None) -> Checkpoint:
        with self._cache.transact():
            count = self._migrated_count(session_key)
            version = count + 1
            cid = "cp_" + hashlib.blake2b(f"{session_key}|{boundary}|{version}".encode(), digest_size=8).hexdigest()
            cp = Checkpoint(cid, session_key, boundary, summary, state, covered_tokens, covered_events,
                            time.time(), model, version, mode, previous, summary_tokens, meta or {})
            self._cache.set(_row(session_key, version), asdict(cp))
            self._cache.set(_count(session_key), version)
            memo = self._memo.get(session_key)
            stored = memo + (cp,) if memo is not None and len(memo) == count else None
        self._remember(session_key, stored if stored is not None else self._load(session_key))
        return cp

    def _migrated_count(self, session_key: str) -> int:
        """The session's checkpoint count, its previous-layout tuple moved to rows first (in a transaction)."""
        count = self._cache.get(_count(session_key))
        if count is not None:
            return count
        legacy = self._cache.get(session_key, ())
        for version, raw in enumerate(legacy, 1):
            self._cache.set(_row(session_key, version), raw)
        if legacy:
            self._cache.set(_count(session_key), len(legacy))
            self._cache.delete(session_key)
        return len(legacy)

    def _remember(self, session_key: str, found: tuple[Checkpoint, ...]) -> tuple[Checkpoint, ...]:
        # Bounded (least recently used out): a memo of every session ever seen would grow forever.
        self._memo[session_key] = found
        self._memo.move_to_end(session_key)
        while len(self._memo) > MEMO_SESSIONS:
            self._memo.popitem(last=False)
        return found

    def _load(self, session_key: str) -> tuple[Checkpoint, ...]:
        with self._cache.transact():
            count = self._cache.get(_count(session_key))
            if count is None:  # nothing added since the previous layout: its tuple, if any
                raw = self._cache.get(session_key, ())
            else:
                raw = [self._cache.get(_row(session_key, version)) for version in range(1, count + 1)]
        return tuple(Checkpoint(**c) for c in raw if c is not None)

    def list(self, session_key: str) -> list[Checkpoint]:
        found = self._memo.get(session_key)
        found = self._remember(session_key, self._load(session_key) if found is None else found)
        return list(found)

    def newest_on_path(self, session_key: str, positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
        return newest_on_path(self.list(session_key), positions)

    def delete_session(self, session_key: str) -> int:
        """Delete every checkpoint of the session; returns how many there were."""
        with self._cache.transact():
            count = self._cache.get(_count(session_key))
            if count is None:
                count = len(self._cache.get(session_key, ()))
            else:
                for version in range(1, count + 1):
                    self._cache.delete(_row(session_key, version))
                self._cache.delete(_count(session_key))
            self._cache.delete(session_key)
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
        self._cache.close()
