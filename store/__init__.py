"""Storage: the ledger, checkpoints and recall index, embedded or shared between replicas.

`open_stores` picks the backend: the embedded SQLite/diskcache store under ``store.path`` by
default, PostgreSQL when ``store.url`` is set (docs/architecture.md, Scale-out). `call` is how
async code calls a store method without blocking the event loop, whichever backend it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, TypeVar

from store.holders import HOLDER
from store.interfaces import StoreBusy

log = logging.getLogger("palimpsest.store")
T = TypeVar("T")


async def call(method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run a store method from async code: in a worker thread when its store does network
    round trips (``blocking = True``: PostgreSQL), inline when it is embedded and sub-millisecond
    (a thread hop would cost more than the call)."""
    if getattr(getattr(method, "__self__", None), "blocking", False):
        return await asyncio.to_thread(method, *args, **kwargs)
    try:
        return method(*args, **kwargs)
    except StoreBusy:  # another process holds the write lock: wait for it off the loop
        return await asyncio.to_thread(method, *args, **kwargs)


async def offload(store, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run `fn` (a function doing several calls on `store`) like `call` would run one of them."""
    if getattr(store, "blocking", False):
        return await asyncio.to_thread(fn, *args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except StoreBusy:
        return await asyncio.to_thread(fn, *args, **kwargs)




class Lease:
    """A held lease (`acquire`); `release` frees it early, otherwise it expires on its own."""

    def __init__(self, store, name: str) -> None:
        self.store, self.name = store, name

    async def release(self) -> None:
        try:
            await call(self.store.release_lease, self.name, HOLDER)
        except Exception:
            log.warning("releasing a lease failed; it expires on its own", exc_info=True)


async def acquire(store, name: str, ttl_s: float) -> Lease | None:
    """The lease `name` for this process for `ttl_s` seconds, or None while another holds it.
    Stores without leases (test doubles) grant every request."""
    if not hasattr(store, "acquire_lease"):
        return Lease(_NoLeases(), name)
    if await call(store.acquire_lease, name, HOLDER, ttl_s):
        return Lease(store, name)
    return None


class _NoLeases:
    def release_lease(self, name: str, holder: str) -> None:
        pass


def open_stores(store_settings) -> tuple[Any, Any]:
    """(ledger, checkpoints) for the ``[store]`` settings."""
    url = getattr(store_settings, "url", None)
    if url:
        from store.postgres import PostgresLedger
        from store.postgres_checkpoints import PostgresCheckpoints
        from store.postgres_pool import open_pool

        pool = open_pool(url, max_size=getattr(store_settings, "pool_size", 10), synchronous=store_settings.sync)
        return PostgresLedger(pool=pool), PostgresCheckpoints(pool=pool)
    from store.checkpoints import DiskCheckpoints
    from store.ledger import Ledger

    ledger = Ledger(store_settings.path, synchronous=store_settings.sync)
    return ledger, DiskCheckpoints(store_settings.path, synchronous=store_settings.sync, has_session=ledger.has_session)


def open_response_ids(store_settings, ledger) -> Any:
    """The Responses id store: in the ledger's PostgreSQL database with ``store.url`` (shared by
    replicas, on the ledger's pool), else the embedded SQLite file under ``store.path``."""
    pool = getattr(ledger, "pool", None)
    if getattr(store_settings, "url", None) and pool is not None:
        from store.postgres_responses import PostgresResponseIds

        return PostgresResponseIds(pool=pool)
    from store.response_ids import ResponseIds

    return ResponseIds(store_settings.path)


def close_stores(ledger, checkpoints) -> None:
    checkpoints.close()
    ledger.close()
    pool = getattr(ledger, "pool", None)
    if pool is not None:
        pool.close()


async def delete_session(session_key: str, *, ledger, checkpoints, index=None, turns=None,
                         responses=None) -> dict[str, int]:
    """Delete a session everywhere it is kept: ledger events, checkpoints, recall index, and
    the Responses ids that name its answers (`responses`, a ``ResponseIdStore``).

    `index` is a `store.index.SearchIndex` or None (nothing indexed, or the index is not open;
    the recall index is a derived cache, so a table left behind is only wasted space, and
    `palimpsest reindex` drops it).

    The ledger's session goes last: while it exists the session is listed (the retention sweep,
    `palimpsest sessions`), so a deletion that fails half-way can be run again, and no
    checkpoint of a deleted session is left for a new session under the same key."""
    checkpoints_deleted = await call(checkpoints.delete_session, session_key)
    if index is not None:
        await index.drop_session(session_key)
    if turns is not None:  # the per-request facts the inspector shows (store.turns)
        turns.delete_session(session_key)
    if responses is not None:
        await call(responses.delete_session, session_key)
    events = await call(ledger.delete_session, session_key)
    return {"events": events, "checkpoints": checkpoints_deleted}


async def sweep_expired(retention_days: float, *, ledger, checkpoints, index=None, turns=None, responses=None,
                        now: float | None = None) -> int:
    """Delete sessions not updated for `retention_days` (the retention TTL); returns how many."""
    cutoff = (time.time() if now is None else now) - retention_days * 86400
    keys = await call(ledger.expired, cutoff)
    for key in keys:
        await delete_session(key, ledger=ledger, checkpoints=checkpoints, index=index, turns=turns, responses=responses)
    if keys:
        log.info("retention sweep deleted sessions", extra={"fields": {"sessions": len(keys), "retention_days": retention_days}})
    return len(keys)
