"""The event ledger: content-addressed, append-only, fork-aware (DESIGN §3).

Every non-system message becomes an event whose id hashes its parent's id and its canonical
form, so the message list of a request maps to a path of ids. Known ids are skipped and new
ones appended; an edited or regenerated turn starts a new branch, nothing is overwritten.
Messages the gateway makes itself (recall calls and results) are *side events* hung off the
node where they happened: they never take part in path matching.

The embedded backend is diskcache (SQLite in WAL mode under ``store.path``). Writes of one
request happen in one transaction before the upstream call starts, so a crash loses no client
message, and concurrent requests on one session never duplicate or lose events.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

import diskcache

from store.canonical import event_id, path_ids, stored_form


@dataclass(frozen=True, slots=True)
class SessionRef:
    """Who a request belongs to: the tenant and its own session id."""

    tenant: str
    session_id: str

    @property
    def key(self) -> str:
        digest = hashlib.blake2b(self.session_id.encode(), digest_size=10).hexdigest()
        return f"{self.tenant}/{digest}"


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    parent: str | None
    seq: int
    role: str
    message: dict
    created: float
    kind: str = "message"  # "message" (on a path) or "side" (gateway-made, hung off `parent`)


@dataclass(slots=True)
class SessionRecord:
    key: str
    tenant: str
    session_id: str
    created: float
    updated: float
    events: int = 0
    head: str | None = None
    requests: int = 0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PathSync:
    ids: list[str]
    added: int


class LedgerStore(Protocol):
    """The interface the gateway depends on; scale-out backends implement the same."""

    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None) -> PathSync: ...
    def append(self, ref: SessionRef, parent: str | None, message: dict) -> Event: ...
    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]: ...
    def get(self, session_key: str, eid: str) -> Event | None: ...
    def since(self, session_key: str, seq: int) -> list[Event]: ...
    def session(self, session_key: str) -> SessionRecord | None: ...
    def sessions(self, tenant: str | None = None) -> list[SessionRecord]: ...
    def close(self) -> None: ...


def _ekey(sk: str, eid: str) -> str:
    return f"e|{sk}|{eid}"


class Ledger:
    """diskcache-backed ledger. Synchronous calls: each is short and runs one transaction."""

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        level = 2 if synchronous == "full" else 1
        self._events = diskcache.Cache(str(root / "ledger"), sqlite_synchronous=level, size_limit=2**62, eviction_policy="none")
        self._sessions = diskcache.Cache(str(root / "sessions"), sqlite_synchronous=level, size_limit=2**62, eviction_policy="none")

    # -- writing ---------------------------------------------------------------------------

    def sync(self, ref: SessionRef, messages: list[dict], ids: list[str] | None = None) -> PathSync:
        """Map non-system messages to their path of ids, appending the ones not yet known.

        `ids` may be passed when the caller already hashed the messages (``path_ids``)."""
        sk = ref.key
        if ids is None:
            ids = path_ids(messages)
        if not ids or _ekey(sk, ids[-1]) in self._events:
            return PathSync(ids, 0)
        # Walk back to the newest known event: usually only the last turn or two are new.
        first_new = len(ids) - 1
        while first_new > 0 and _ekey(sk, ids[first_new - 1]) not in self._events:
            first_new -= 1
        with self._events.transact(), self._sessions.transact():
            record = self._record(ref)
            added = 0
            for i in range(first_new, len(ids)):
                if self._put(record, ids[i - 1] if i else None, ids[i], messages[i], "message"):
                    added += 1
            record.head = ids[-1]
            self._sessions[sk] = record
        return PathSync(ids, added)

    def append(self, ref: SessionRef, parent: str | None, message: dict) -> Event:
        """Record one message (the upstream's answer) as the child of `parent`."""
        eid = event_id(parent, message)
        with self._events.transact(), self._sessions.transact():
            record = self._record(ref)
            self._put(record, parent, eid, message, "message")
            record.head = eid
            self._sessions[ref.key] = record
        return self.get(ref.key, eid)  # type: ignore[return-value]

    def add_side_events(self, ref: SessionRef, node: str | None, messages: Iterable[dict]) -> list[Event]:
        """Gateway-made messages (recall calls and results), hung off `node`."""
        out = []
        with self._events.transact(), self._sessions.transact():
            record = self._record(ref)
            side_key = f"x|{ref.key}|{node}"
            side = list(self._events.get(side_key, ()))
            for message in messages:
                # Side events chain among themselves so identical recall rounds stay distinct.
                eid = event_id(f"side:{node}:{len(side)}", message)
                if self._put(record, node, eid, message, "side"):
                    side.append(eid)
                out.append(eid)
            self._events[side_key] = tuple(side)
            self._sessions[ref.key] = record
        return [e for e in (self.get(ref.key, eid) for eid in out) if e is not None]

    def note_request(self, ref: SessionRef) -> None:
        """Count a request on the session (cheap bookkeeping for the inspector)."""
        with self._sessions.transact():
            record = self._sessions.get(ref.key)
            if record is not None:
                record.requests += 1
                self._sessions[ref.key] = record

    def _record(self, ref: SessionRef) -> SessionRecord:
        record = self._sessions.get(ref.key)
        if record is None:
            now = time.time()
            record = SessionRecord(key=ref.key, tenant=ref.tenant, session_id=ref.session_id, created=now, updated=now)
        return record

    def _put(self, record: SessionRecord, parent: str | None, eid: str, message: dict, kind: str) -> bool:
        sk = record.key
        key = _ekey(sk, eid)
        if key in self._events:
            return False
        seq = record.events
        now = time.time()
        stored = stored_form(message)
        event = Event(eid, parent, seq, str(stored.get("role")), stored, now, kind)
        self._events[key] = asdict(event)
        self._events[f"q|{sk}|{seq}"] = eid
        if kind == "message":
            children_key = f"c|{sk}|{parent}"
            self._events[children_key] = self._events.get(children_key, ()) + (eid,)
        record.events = seq + 1
        record.updated = now
        return True

    # -- reading ---------------------------------------------------------------------------

    def get(self, session_key: str, eid: str) -> Event | None:
        raw = self._events.get(_ekey(session_key, eid))
        return Event(**raw) if raw is not None else None

    def get_many(self, session_key: str, ids: Iterable[str]) -> list[Event]:
        return [e for e in (self.get(session_key, i) for i in ids) if e is not None]

    def since(self, session_key: str, seq: int) -> list[Event]:
        """Events appended after `seq`, in insertion order (the index catches up with this)."""
        record = self._sessions.get(session_key)
        if record is None:
            return []
        out = []
        for n in range(seq + 1, record.events):
            eid = self._events.get(f"q|{session_key}|{n}")
            event = self.get(session_key, eid) if eid else None
            if event is not None:
                out.append(event)
        return out

    def children(self, session_key: str, eid: str | None) -> tuple[str, ...]:
        return self._events.get(f"c|{session_key}|{eid}", ())

    def side_events(self, session_key: str, node: str | None) -> list[Event]:
        return self.get_many(session_key, self._events.get(f"x|{session_key}|{node}", ()))

    def path_to(self, session_key: str, eid: str) -> list[Event]:
        """The path from the root to `eid` (walks parents; for the inspector, not the hot path)."""
        out = []
        current: str | None = eid
        while current is not None:
            event = self.get(session_key, current)
            if event is None:
                break
            out.append(event)
            current = event.parent
        out.reverse()
        return out

    def heads(self, session_key: str) -> list[str]:
        """Leaves of the session's tree: one per branch."""
        record = self._sessions.get(session_key)
        if record is None:
            return []
        leaves = []
        for n in range(record.events):
            eid = self._events.get(f"q|{session_key}|{n}")
            event = self.get(session_key, eid) if eid else None
            if event is not None and event.kind == "message" and not self.children(session_key, eid):
                leaves.append(eid)
        return leaves

    def session(self, session_key: str) -> SessionRecord | None:
        return self._sessions.get(session_key)

    def sessions(self, tenant: str | None = None) -> list[SessionRecord]:
        records = [self._sessions[k] for k in self._sessions.iterkeys()]
        if tenant is not None:
            records = [r for r in records if r.tenant == tenant]
        return sorted(records, key=lambda r: r.updated, reverse=True)

    def volume_bytes(self) -> int:
        return int(self._events.volume() + self._sessions.volume())

    def close(self) -> None:
        self._events.close()
        self._sessions.close()
