"""Read-only stand-ins the inspector builds views with (docs/architecture.md, "Inspection").

A session read once (``SessionEvents``), windows without an upstream (``ConfiguredWindows``) or
as the gateway recorded them (``RecordedWindows``), checkpoints as they stood at a moment
(``CheckpointsAsOf``), and collaborators that do nothing (``NoSummaries``, ``NoMetrics``), so
looking at a session never starts a summary job, moves a counter or calls the upstream.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gateway.pipeline.windows import DEFAULT_WINDOW, KNOWN
from store.records import Checkpoint, Event


class NoSummaries:
    """Stands in for the summarizer: inspecting a view must never start a summary job."""

    async def sync(self, *args, **kwargs) -> None:
        return None


class NoMetrics:
    """Stands in for the metrics: inspecting a view moves none of the gateway's counters (and the
    CLI does not import the Prometheus client)."""

    def __getattr__(self, name: str) -> "NoMetrics":
        return self

    def labels(self, *args, **kwargs) -> "NoMetrics":
        return self

    def inc(self, *args, **kwargs) -> None:
        return None

    def observe(self, *args, **kwargs) -> None:
        return None

    def set(self, *args, **kwargs) -> None:
        return None


class CheckpointsAsOf:
    """The checkpoint store as it stood at `cutoff`: what a request made then could use."""

    def __init__(self, checkpoints, cutoff: float | None = None) -> None:
        self._checkpoints = checkpoints
        self.cutoff = cutoff

    def list(self, session_key: str) -> list[Checkpoint]:
        found = self._checkpoints.list(session_key)
        return found if self.cutoff is None else [c for c in found if c.created <= self.cutoff]

    def newest_on_path(self, session_key: str, positions: dict[str, int]):
        for cp in reversed(self.list(session_key)):
            if cp.boundary in positions:
                return cp, positions[cp.boundary]
        return None


class ConfiguredWindows:
    """Windows without an upstream (``palimpsest inspect``): configuration, then the table of
    well-known models, then the gateway's conservative default. Never makes a network call."""

    def __init__(self, configured: dict[str, int]) -> None:
        self.configured = configured

    async def window(self, model: str, auth=None) -> int:
        if model in self.configured:
            return self.configured[model]
        return next((size for prefix, size in KNOWN if model.startswith(prefix)), DEFAULT_WINDOW)


class RecordedWindows:
    """The window the gateway recorded for the model, else the fallback's."""

    def __init__(self, recorded: dict[str, int], fallback) -> None:
        self.recorded, self.fallback = recorded, fallback

    async def window(self, model: str, auth=None) -> int:
        found = self.recorded.get(model)
        return found if found else await self.fallback.window(model, auth)


@dataclass(slots=True)
class SessionEvents:
    """A session's events read once: path walks and side events without more queries."""

    by_id: dict[str, Event]
    side: dict[str | None, list[Event]] = field(default_factory=dict)

    @classmethod
    def load(cls, ledger, session_key: str) -> "SessionEvents":
        by_id: dict[str, Event] = {}
        side: dict[str | None, list[Event]] = defaultdict(list)
        for event in ledger.since(session_key, -1):
            if event.kind == "message":
                by_id[event.id] = event
            else:
                side[event.parent].append(event)
        return cls(by_id, dict(side))

    def path_to(self, eid: str) -> list[Event]:
        out, current = [], self.by_id.get(eid)
        while current is not None:
            out.append(current)
            current = self.by_id.get(current.parent) if current.parent else None
        out.reverse()
        return out

    def heads(self) -> list[str]:
        parents = {e.parent for e in self.by_id.values()}
        return [e.id for e in sorted(self.by_id.values(), key=lambda e: e.seq) if e.id not in parents]
