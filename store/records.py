"""The store's record types, imported by both backends and by the gateway.

``SessionRef`` names a request's session, ``Event`` is one ledger event, ``SessionRecord`` a
session's row, ``PathSync`` what a sync did, ``Checkpoint`` one summary checkpoint. The gateway
is typed against these and the Protocols of ``store/interfaces.py``, never against a backend
module (docs/architecture.md, "Stores").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SessionRef:
    """Who a request belongs to: the tenant and its own session id."""

    tenant: str
    session_id: str
    key: str = field(init=False, repr=False, compare=False)  # "tenant/hash": the storage key

    def __post_init__(self) -> None:
        digest = hashlib.blake2b(self.session_id.encode(), digest_size=10).hexdigest()
        object.__setattr__(self, "key", f"{self.tenant}/{digest}")


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
    model: str | None = None  # of the newest request


@dataclass(frozen=True, slots=True)
class PathSync:
    ids: list[str]
    added: int


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
