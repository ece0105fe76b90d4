"""The store interfaces the gateway depends on (see docs/architecture.md, "Stores").

Each Protocol lists exactly the methods gateway code calls today on the embedded backends
(``store.ledger.Ledger``, ``store.checkpoints.DiskCheckpoints``, ``store.index.SearchIndex``,
``store.response_ids.ResponseIds``),
with the same signatures. A scale-out backend (e.g. a PostgreSQL ledger) implements the same
methods; the composition root (``gateway/app.py``) is the only place that names a concrete
class, and ``gateway/keys.py`` types the application keys against these Protocols.

Synchronous methods are short, one transaction each. A store whose calls do network round
trips (PostgreSQL, ``store.postgres``) says ``blocking = True``; async gateway code calls store
methods through ``store.call`` / ``store.offload``, which run those in a worker thread and the
embedded ones inline. The search index is asynchronous where it embeds or reads tables.

Importing this module is cheap: the record types are only imported for type checking, so it
never pulls in SQLite, diskcache or LanceDB.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from store.records import Checkpoint
    from store.index import Hit, IndexedEvent
    from store.records import Event, PathSync, SessionRecord, SessionRef
    from store.response_ids import RecordedResponse
    from store.turns import StoredReceipt, TurnBasis


class StoreBusy(Exception):
    """An embedded store is locked by another writer (another process on the same files).

    Raised instead of waiting when the caller is on the event loop; `store.call` then runs the
    call again in a worker thread, where the store waits for the lock."""


def on_event_loop() -> bool:
    """True when called from a thread running an asyncio loop: a store must not block there."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@runtime_checkable
class LedgerStore(Protocol):
    """The append-only, content-addressed, fork-aware event ledger."""

    # -- writing (the chat pipeline and the recall loop) -------------------------------------
    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None,
             model: str | None = None) -> PathSync:
        """Map the request's message list onto a path of event ids, appending unknown events
        (one transaction); `ids` are precomputed ids of `messages`, `model` the request's."""
        ...

    def append(self, ref: SessionRef, parent: str | None, message: dict, *,
               defer: bool = False) -> Event:
        """Append one message under `parent` (the answer); `defer` lets the write ride the next
        flush instead of its own transaction."""
        ...

    def flush(self) -> None:
        """Write deferred appends now (called every ~0.5 s by the app, and on close)."""
        ...

    def checkpoint(self) -> None:
        """Periodic maintenance off the event loop (SQLite: WAL checkpoint); may be a no-op."""
        ...

    def add_side_events(self, ref: SessionRef, node: str | None,
                        messages: Iterable[dict]) -> list[Event]:
        """Hang gateway-made messages (recall calls and results, notes) off `node`; they never
        take part in path matching (their Event.kind is "side")."""
        ...

    # -- reading (recall tools, indexer, inspector) ------------------------------------------
    def holds(self, session_key: str, eid: str, *, cached: bool = True) -> bool:
        """Whether the session holds event `eid` (an existence check, no row read); with
        ``cached=False`` never from a process-local cache (another process may have deleted it)."""
        ...

    def get(self, session_key: str, eid: str) -> Event | None: ...

    def get_many(self, session_key: str, ids: Iterable[str]) -> list[Event]: ...

    def since(self, session_key: str, seq: int) -> list[Event]:
        """Events of the session with seq > `seq`, in insertion order."""
        ...

    def children(self, session_key: str, eid: str | None) -> tuple[str, ...]:
        """Ids of the path events whose parent is `eid` (None: the roots)."""
        ...

    def side_events(self, session_key: str, node: str | None) -> list[Event]:
        """The side events hung off `node`, in insertion order."""
        ...

    def path_to(self, session_key: str, eid: str) -> list[Event]:
        """The path from the root to `eid`, root first."""
        ...

    def heads(self, session_key: str) -> list[str]:
        """Ids of the leaves of the session's tree (one per branch), oldest first."""
        ...

    def session(self, session_key: str) -> SessionRecord | None: ...

    def sessions(self, tenant: str | None = None) -> list[SessionRecord]: ...

    # -- operations --------------------------------------------------------------------------
    def session_count(self) -> int: ...

    def volume_bytes(self) -> int: ...

    def tenant_bytes(self, tenant: str) -> int:
        """Bytes of the stored messages of every session of `tenant` (storage quotas)."""
        ...

    def ping(self) -> None:
        """Raise when the store cannot be reached (GET /readyz)."""
        ...

    def delete_session(self, session_key: str) -> int:
        """Delete the session's events and record; the number of events deleted."""
        ...

    def expired(self, before: float) -> list[str]:
        """Keys of sessions not updated since `before` (epoch seconds): the retention sweep."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Summary checkpoints, kept as versions and never overwritten."""

    def add(self, session_key: str, *, boundary: str, summary: str, state: dict,
            covered_tokens: int, covered_events: int, model: str, mode: str,
            previous: str | None, summary_tokens: int, meta: dict | None = None) -> Checkpoint: ...

    def list(self, session_key: str) -> list[Checkpoint]:
        """Every checkpoint of the session, oldest first."""
        ...

    def newest_on_path(self, session_key: str,
                       positions: dict[str, int]) -> tuple[Checkpoint, int] | None:
        """The newest checkpoint whose boundary is on the path (`positions`: event id → index
        on the path), with the boundary's index."""
        ...

    def delete_session(self, session_key: str) -> int:
        """Delete every checkpoint of the session; how many there were."""
        ...

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease `name` for `ttl_s` s; False while another holder has it
        (one summariser per session across replicas; see ``store.acquire``)."""
        ...

    def release_lease(self, name: str, holder: str) -> None: ...

    def volume_bytes(self) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class SearchIndex(Protocol):
    """The per-session recall index (hybrid full-text + vector search over events)."""

    async def add(self, session_key: str, events: list[IndexedEvent]) -> int:
        """Index events not yet indexed for the session; returns the chunks written."""
        ...

    def indexed_seq(self, session_key: str) -> int:
        """Highest ledger seq indexed for the session, -1 when none."""
        ...

    async def search(self, session_key: str, query: str, limit: int = 5,
                     exclude_event_ids: frozenset[str] = frozenset()) -> list[Hit]:
        """Events of this session best matching `query`, best first, at most `limit`."""
        ...

    async def reset(self) -> None:
        """Drop every session's index (``palimpsest reindex``)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class TurnLogStore(Protocol):
    """What each answered request was built on (``store.turns``): written by the gateway's
    ``TurnRecorder``, read by the inspector (docs/architecture.md, "Inspection")."""

    def add(self, basis: TurnBasis) -> None:
        """Remember one request's basis (buffered: it reaches the store with the next `flush`)."""
        ...

    def flush(self) -> None: ...

    def session(self, session_key: str) -> list[TurnBasis]:
        """Every recorded request of the session, oldest first."""
        ...

    def add_parts(self, session_key: str, parts: dict[str, bytes]) -> None:
        """Remember request parts of the session by content address (buffered, kept once)."""
        ...

    def parts(self, session_key: str) -> dict[str, bytes]:
        """The session's request parts (``gateway/pipeline/request_form.py``), by content address."""
        ...

    def delete_session(self, session_key: str) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class ReceiptStore(Protocol):
    """Each request's receipt (``gateway/ops/receipts.py``), kept as long as its session:
    ``store.turns.TurnLog`` keeps them next to the turn rows and deletes them with the session."""

    def add_receipt(self, receipt: StoredReceipt) -> None:
        """Remember one receipt (buffered: it reaches the store with the next `flush`)."""
        ...

    def receipt(self, receipt_id: str) -> StoredReceipt | None: ...

    def flush(self) -> None: ...

    def delete_session(self, session_key: str) -> int: ...


@runtime_checkable
class ResponseIdStore(Protocol):
    """Which recorded answer a Responses API id names, per tenant (``store.response_ids``),
    and the secret compaction items are sealed with. Shared by replicas with ``store.url``."""

    def secret(self) -> bytes:
        """The store's compaction-item secret (made by the first caller, the same for all)."""
        ...

    def remember(self, tenant: str, response_id: str, session_key: str, event_id: str,
                 items: Sequence[str] = ()) -> None:
        """`response_id` names the answer `event_id` of `session_key` for `tenant` only, and
        `items` (its output items' ids) are `tenant`'s."""
        ...

    def item_owners(self, item_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        """The tenants each of `item_ids` is recorded for (ids nobody recorded are absent)."""
        ...

    def find(self, tenant: str, response_id: str) -> RecordedResponse | None:
        """`tenant`'s recorded response of that id (another tenant's is never returned)."""
        ...

    def taken(self, response_id: str) -> bool:
        """Whether any tenant has `response_id` recorded."""
        ...

    def forget(self, tenant: str, response_id: str) -> None: ...

    def delete_session(self, session_key: str) -> int: ...

    def close(self) -> None: ...
