"""Summary checkpoints (docs/architecture.md, "Summary checkpoints"): kept as versions, never overwritten.

A checkpoint covers a session's path up to its boundary event. The view of a request uses the
newest checkpoint whose boundary lies on the request's own path, so a fork picks the newest
checkpoint of its own branch and an edit before a boundary simply falls back to an older one.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
import diskcache

from store.holders import holder_is_gone

MEMO_SESSIONS = 256  # sessions whose checkpoints stay decoded in memory (LRU); the rest are read back


@dataclass(frozen=True, slots=True)
class Checkpoint:
    id: str
    session_key: str
    boundary: str  # id of the last event the summary covers
    summary: str
    state: dict  # deterministic exact values (policies.extraction)
    covered_tokens: int
    covered_events: int
    created: float
    model: str
    version: int
    mode: str = "async"  # async | sync
    previous: str | None = None
    summary_tokens: int = 0
    meta: dict = field(default_factory=dict)


def newest_on_path(checkpoints: list[Checkpoint], positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
    """The newest of a session's checkpoints (oldest first) whose boundary is on the request's
    path (`positions`: event id -> index), with that index; both checkpoint stores use it."""
    for cp in reversed(checkpoints):
        pos = positions.get(cp.boundary)
        if pos is not None:
            return cp, pos
    return None


class DiskCheckpoints:
    """diskcache-backed checkpoints with an in-memory copy per session (read on every request).

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
        )
        self._memo: OrderedDict[str, tuple[Checkpoint, ...]] = OrderedDict()

    def add(self, session_key: str, *, boundary: str, summary: str, state: dict, covered_tokens: int,
            covered_events: int, model: str, mode: str, previous: str | None, summary_tokens: int,
            meta: dict | None = None) -> Checkpoint:
        with self._cache.transact():
            existing = self._load(session_key)
            version = len(existing) + 1
            cid = "cp_" + hashlib.blake2b(f"{session_key}|{boundary}|{version}".encode(), digest_size=8).hexdigest()
            cp = Checkpoint(cid, session_key, boundary, summary, state, covered_tokens, covered_events,
                            time.time(), model, version, mode, previous, summary_tokens, meta or {})
            stored = existing + (cp,)
            self._cache[session_key] = tuple(asdict(c) for c in stored)
        self._remember(session_key, stored)
        return cp

    def _remember(self, session_key: str, found: tuple[Checkpoint, ...]) -> tuple[Checkpoint, ...]:
        # Bounded: every checkpoint of every session ever seen stayed in memory (issue 9, load).
        self._memo[session_key] = found
        self._memo.move_to_end(session_key)
        while len(self._memo) > MEMO_SESSIONS:
            self._memo.popitem(last=False)
        return found

    def _load(self, session_key: str) -> tuple[Checkpoint, ...]:
        raw = self._cache.get(session_key, ())
        return tuple(Checkpoint(**c) for c in raw)

    def list(self, session_key: str) -> list[Checkpoint]:
        found = self._memo.get(session_key)
        found = self._remember(session_key, self._load(session_key) if found is None else found)
        return list(found)

    def newest_on_path(self, session_key: str, positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
        return newest_on_path(self.list(session_key), positions)

    def delete_session(self, session_key: str) -> int:
        """Delete every checkpoint of the session; returns how many there were."""
        with self._cache.transact():
            count = len(self._load(session_key))
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
