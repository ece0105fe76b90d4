"""What the inspector shows, built once for the admin API, its UI and ``palimpsest inspect``.

Everything here reads the store and never writes it: a session's branches, the events of one
branch with their token counts and what the view does to them (summarized behind a checkpoint,
compacted to a placeholder, dropped by tailoring), the recall calls hung off each node, the
checkpoints, per-request token figures, and the exact view the upstream would receive.

The view is made by the gateway's own ``ViewBuilder`` on a copy that cannot start summary jobs
and counts into a private metrics registry, so looking at a session neither changes the
ledger, nor makes LLM calls, nor moves the gateway's counters. System prompts, tools and the
request's model are not stored (they belong to each request), so callers may pass them in.

What each past request was built on (model, window, budget, client and upstream tokens) is
read from the turn log (``store.turns``), which the gateway writes as it answers: the inspector
shows what the live gateway used, never asks the upstream for a window, and does not re-project
every past request. A session is read with one ledger query (docs/architecture.md, "Inspection").
"""

from __future__ import annotations

from dataclasses import dataclass


from gateway.chat.adapter import chat_request
from gateway.http.errors import BadRequest, NotFound
from gateway.pipeline.views import ViewBuilder
from gateway.ops.readonly import CheckpointsAsOf, RecordedWindows, SessionEvents
from store.records import Checkpoint, Event, SessionRecord, SessionRef
from store.turns import TurnBasis

PREVIEW_CHARS = 200
UNKNOWN_MODEL = "unknown"
NOT_RECORDED = "not recorded"
NOT_STORED = ("System prompts and tools are request instructions, not history: the ledger does not "
              "store them. For the exact view, give the client's: `palimpsest inspect SESSION --view "
              "--system TEXT|@FILE --tools FILE`, or `system` and `tools` in the admin API's request.")
STORED_FORM = "Messages are in the ledger's stored form: null and empty fields the SDKs add are dropped."


@dataclass(slots=True)
class ViewInputs:
    """What a request carries besides its history (none of it is stored)."""

    model: str | None = None
    system: str | list[dict] | None = None
    tools: list[dict] | None = None
    max_tokens: int | None = None

    def instructions(self) -> list[dict]:
        if self.system is None or self.system == "":
            return []
        if isinstance(self.system, str):
            return [{"role": "system", "content": self.system}]
        return list(self.system)


@dataclass(slots=True)
class Inspector:
    ledger: object
    checkpoints: object
    views: ViewBuilder  # read-only copy of the gateway's builder (see `wrap`)
    settings: object
    turn_log: object  # store.turns.TurnLog: what each answered request was built on

    @classmethod
    def wrap(cls, *, ledger, checkpoints, views: ViewBuilder, settings, turns) -> "Inspector":
        """A read-only copy of the gateway's view builder: same windows, counter, calibration."""
        return cls(ledger, checkpoints, views.readonly(), settings, turns)  # the gateway's counters stay honest

    def _builder(self, cutoff: float | None, recorded: dict[str, int] | None = None) -> ViewBuilder:
        # One copy per view: concurrent inspections never share a cutoff.
        windows = RecordedWindows(recorded, self.views.windows) if recorded else self.views.windows
        return self.views.readonly(checkpoints=CheckpointsAsOf(self.checkpoints, cutoff), windows=windows)

    @property
    def counter(self):
        return self.views.counter

    # -- sessions ----------------------------------------------------------------------------

    def sessions(self, tenant: str | None = None, limit: int | None = None) -> list[dict]:
        return list_sessions(self.ledger, self.checkpoints, tenant, limit)

    def _session_row(self, record: SessionRecord) -> dict:
        return session_row(record, self.checkpoints)

    def find(self, wanted: str, tenant: str | None = None) -> SessionRecord:
        """A session by key (tenant/hash) or by the client's own session id."""
        record = self.ledger.session(wanted)
        if record is not None and (tenant is None or record.tenant == tenant):
            return record
        matches = [r for r in self.ledger.sessions(tenant) if r.session_id == wanted]
        if len(matches) > 1:
            tenants = ", ".join(sorted(r.tenant for r in matches))
            raise BadRequest(f"Session id '{wanted}' exists for several tenants ({tenants}); pass the tenant or the key.")
        if not matches:
            raise NotFound(f"No session '{wanted}'.")
        return matches[0]

    # -- one session -------------------------------------------------------------------------

    def path(self, record: SessionRecord, head: str | None, events: SessionEvents | None = None) -> list[Event]:
        events = events or SessionEvents.load(self.ledger, record.key)
        head = head or record.head
        if not head or head not in events.by_id:
            raise NotFound(f"No event '{head}' on a path of session '{record.key}'.")
        return events.path_to(head)

    def recorded(self, record: SessionRecord, path: list[Event]) -> list[TurnBasis]:
        """The turn log's rows for requests on `path`, oldest first (the newest per request)."""
        on_path = {e.id for e in path}
        newest: dict[str | None, TurnBasis] = {}
        for basis in self.turn_log.session(record.key):
            if basis.node in on_path:
                newest[basis.node] = basis
        return sorted(newest.values(), key=lambda b: b.created)

    async def session_detail(self, record: SessionRecord, head: str | None = None,
                             inputs: ViewInputs | None = None) -> dict:
        inputs = inputs or ViewInputs()
        session = SessionEvents.load(self.ledger, record.key)
        path = self.path(record, head, session)
        recorded = self.recorded(record, path)
        model, model_source = self._model(record, inputs, recorded)
        view = await self._view(record, path, inputs, model, recorded=recorded)
        positions = {e.id: i for i, e in enumerate(path)}
        checkpoint = self._checkpoint(record, view.checkpoint)
        boundary = positions.get(checkpoint.boundary, -1) if checkpoint else -1
        sent_tools = {m.get("tool_call_id"): m for m in (view.messages or []) if m.get("role") == "tool"}
        events = []
        for i, event in enumerate(path):
            row = self._event_row(record.key, event)
            summarized = i <= boundary
            hidden = event.id in view.hidden
            sent = sent_tools.get(event.message.get("tool_call_id")) if event.role == "tool" else None
            compacted = hidden and not summarized and sent is not None and sent.get("content") != event.message.get("content")
            row.update(hidden=hidden, summarized=summarized, compacted=compacted,
                       dropped=hidden and not summarized and not compacted)
            row["side_events"] = [self._event_row(record.key, s) for s in session.side.get(event.id, ())]
            events.append(row)
        turns = self.turns(path, recorded)
        for turn in turns:  # which upstream the configuration routes the turn's model to
            turn["upstream"] = self.settings.upstream_for(turn["model"])
        client = sum(t["client_tokens"] for t in turns)
        upstream = sum(t["upstream_tokens"] for t in turns)
        return {
            "session": self._session_row(record),
            "head": path[-1].id,
            "branches": self.branches(record, session),
            "basis": {"model": model, "model_source": model_source, "upstream": self.settings.upstream_for(model),
                      "checkpoint": view.checkpoint,
                      "boundary": checkpoint.boundary if checkpoint else None, "system_prompt": self._system_note(inputs),
                      "window": view.window, "budget": view.budget,
                      "window_source": _window_source(model, recorded, inputs)},
            "events": events,
            "checkpoints": [self._checkpoint_row(cp, positions, view.checkpoint) for cp in self.checkpoints.list(record.key)],
            "turns": turns,
            "totals": {
                "requests": len(turns), "client_tokens": client, "upstream_tokens": upstream,
                "saved_tokens": client - upstream, "saved_ratio": round(1 - upstream / client, 4) if client else 0.0,
                "recall_calls": sum(len(s["tool_calls"]) for e in events for s in e["side_events"]),
                "summary_tokens": sum(cp.summary_tokens for cp in self.checkpoints.list(record.key)),
                "cached_tokens": sum(t["cached_tokens"] or 0 for t in turns),
                "cost_usd": (round(sum(t["cost_usd"] for t in turns if t["cost_usd"] is not None), 6)
                             if any(t["cost_usd"] is not None for t in turns) else None),
            },
        }

    def branches(self, record: SessionRecord, session: SessionEvents | None = None) -> list[dict]:
        session = session or SessionEvents.load(self.ledger, record.key)
        out = []
        for head in session.heads():
            path = session.path_to(head)
            out.append({"head": head, "length": len(path), "current": head == record.head,
                        "updated": path[-1].created if path else None})
        return sorted(out, key=lambda b: b["updated"] or 0, reverse=True)

    @staticmethod
    def turns(path: list[Event], recorded: list[TurnBasis]) -> list[dict]:
        """Each answered request on the path as the gateway recorded it when it answered: the
        model, window and budget its view was fitted to, client vs upstream prompt tokens.
        Requests answered before the turn log existed have no row."""
        positions = {e.id: i for i, e in enumerate(path)}
        out = []
        for basis in recorded:
            i = positions[basis.node]
            out.append({"event": basis.node, "seq": path[i].seq, "index": i, "client_tokens": basis.client_tokens,
                        "upstream_tokens": basis.upstream_tokens, "checkpoint": basis.checkpoint,
                        "answered": basis.answer is not None, "model": basis.model, "window": basis.window,
                        "budget": basis.budget, "recall_calls": basis.recall_calls, "created": basis.created,
                        "cached_tokens": basis.cached_tokens, "uncached_tokens": basis.uncached_tokens,
                        "cache_write_tokens": basis.cache_write_tokens, "cost_usd": basis.cost_usd,
                        "receipt": basis.receipt, "compaction_event": basis.compaction_event,
                        "billed_units": basis.billed_units})
        return out

    async def projected_view(self, record: SessionRecord, head: str | None = None, inputs: ViewInputs | None = None,
                             checkpoint: str | None = None) -> dict:
        """The exact body the upstream would receive if the client resent this path now.

        `checkpoint` pins the view to the checkpoints that existed when that one was made
        (what the model saw then, before later summaries)."""
        inputs = inputs or ViewInputs()
        path = self.path(record, head)
        recorded = self.recorded(record, path)
        model, model_source = self._model(record, inputs, recorded)
        cutoff = None
        if checkpoint:
            pinned = self._checkpoint(record, checkpoint)
            if pinned is None:
                raise NotFound(f"No checkpoint '{checkpoint}' in session '{record.key}'.")
            cutoff = pinned.created
        chat, view = await self._chat_and_view(record, path, inputs, model, cutoff=cutoff, recorded=recorded)
        untouched = view.messages is None
        return {
            "session": record.key, "head": path[-1].id, "model": model, "model_source": model_source,
            "upstream": self.settings.upstream_for(model), "system_prompt": self._system_note(inputs), "form": STORED_FORM, "checkpoint": view.checkpoint,
            "untouched": untouched,
            "messages": chat.body["messages"] if untouched else view.messages,
            "tools": chat.body.get("tools") if untouched or view.tools is None else view.tools,
            "recall_tools": list(view.recall_names) if view.recall_names else None,
            "hidden": sorted(view.hidden),
            "tokens": {"client": view.client_tokens, "upstream": view.upstream_tokens,
                       "saved": view.client_tokens - view.upstream_tokens, "window": view.window, "budget": view.budget,
                       "window_source": _window_source(model, recorded, inputs),
                       "calibration": round(self.views.calibration.factor(model), 4)},
        }

    # -- building blocks ---------------------------------------------------------------------

    async def _view(self, record, path, inputs, model, *, cutoff=None, recorded=()):
        return (await self._chat_and_view(record, path, inputs, model, cutoff=cutoff, recorded=recorded))[1]

    async def _chat_and_view(self, record: SessionRecord, path: list[Event], inputs: ViewInputs, model: str, *,
                             cutoff: float | None = None, recorded: list[TurnBasis] | tuple = ()):
        body: dict = {"model": model, "messages": [*inputs.instructions(), *(e.message for e in path)]}
        if inputs.tools:
            body["tools"] = inputs.tools
        if inputs.max_tokens:
            body["max_tokens"] = inputs.max_tokens
        chat = chat_request(body)
        # The path is history as the ledger holds it, each event with its id, whatever its role
        # (the parser would take a system-role event for an instruction).
        chat.instructions, chat.history = inputs.instructions(), [e.message for e in path]
        chat.ids = [e.id for e in path]
        windows = {b.model: b.window for b in recorded if b.window}  # the newest per model
        view = await self._builder(cutoff, windows).build(chat, SessionRef(record.tenant, record.session_id))
        return chat, view

    def _model(self, record: SessionRecord, inputs: ViewInputs, recorded: list[TurnBasis]) -> tuple[str, str]:
        """The caller's model, else the session's newest request's, else the checkpoints'."""
        if inputs.model:
            return inputs.model, "given"
        if recorded:
            return recorded[-1].model, "newest request"
        if record.model:
            return record.model, "newest request"
        if not self.settings.policy.summary_model:
            for cp in reversed(self.checkpoints.list(record.key)):
                return cp.model, "checkpoint"
        if self.settings.models:
            return next(iter(self.settings.models)), "not stored: first configured model; pass `model`"
        # Still show the session: its window then comes from discovery or the default.
        return UNKNOWN_MODEL, "not stored and no checkpoint names it; pass `model`"

    def _checkpoint(self, record: SessionRecord, cid: str | None) -> Checkpoint | None:
        return next((c for c in self.checkpoints.list(record.key) if c.id == cid), None) if cid else None

    @staticmethod
    def _system_note(inputs: ViewInputs) -> str:
        return "given" if inputs.system else NOT_STORED

    def _event_row(self, session_key: str, event: Event) -> dict:
        message = event.message
        return {
            "id": event.id, "parent": event.parent, "seq": event.seq, "role": event.role, "kind": event.kind,
            "created": event.created, "tokens": self.counter.count_message(message, event.id),
            "preview": preview(message), "tool_call_id": message.get("tool_call_id"),
            "tool_calls": [(c.get("function") or {}).get("name") for c in message.get("tool_calls") or ()],
        }

    @staticmethod
    def _checkpoint_row(cp: Checkpoint, positions: dict[str, int], in_view: str | None) -> dict:
        return {
            "id": cp.id, "version": cp.version, "boundary": cp.boundary, "on_path": cp.boundary in positions,
            "in_view": cp.id == in_view, "covered_events": cp.covered_events, "covered_tokens": cp.covered_tokens,
            "summary": cp.summary, "summary_tokens": cp.summary_tokens, "state": cp.state, "created": cp.created,
            "model": cp.model, "mode": cp.mode, "previous": cp.previous,
        }


def list_sessions(ledger, checkpoints, tenant: str | None = None, limit: int | None = None) -> list[dict]:
    """Sessions, newest first (needs no view builder: ``palimpsest inspect`` without a session)."""
    return [session_row(r, checkpoints) for r in ledger.sessions(tenant)[:limit]]


def session_row(record: SessionRecord, checkpoints) -> dict:
    return {
        "key": record.key, "tenant": record.tenant, "session_id": record.session_id,
        "created": record.created, "updated": record.updated, "events": record.events,
        "requests": record.requests, "head": record.head, "model": record.model,
        "checkpoints": len(checkpoints.list(record.key)),
    }


def _window_source(model: str, recorded: list[TurnBasis], inputs: ViewInputs) -> str:
    """Where the view's window came from: what the gateway recorded, or (for sessions answered
    before the turn log, or another model) configuration and discovery."""
    if any(b.model == model for b in recorded):
        return "recorded by the gateway"
    return NOT_RECORDED + ": configured or discovered"


def preview(message: dict, limit: int = PREVIEW_CHARS) -> str:
    """The first characters of a message's text; tool calls shown as name(arguments)."""
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", f"[{p.get('type')}]") if isinstance(p, dict) else str(p) for p in content)
    text = content or ""
    calls = [f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments') or ''})"
             for c in message.get("tool_calls") or ()]
    if calls:
        text = (text + " " if text else "") + "→ " + ", ".join(calls)
    return text[:limit]
