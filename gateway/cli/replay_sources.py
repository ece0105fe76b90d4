"""What ``palimpsest replay`` re-sends (docs/architecture.md, "Replay"): the requests of a JSONL
file (``--from``: one request body a line, with its session key and wire format), or those of
the configured store's sessions (all, one tenant's, or named ones).

Every answered request has a row in the turn log (``store/turns.py``): its format, its model, the
node its history ends at, and what of it the ledger does not hold (its *form*,
``gateway/pipeline/request_form.py``). A request is rebuilt as the client sent it from its form
and its path in the ledger, by its format's ``request_form.rebuild`` (``gateway/chat``,
``gateway/responses``, ``gateway/messages``), in the order the gateway answered them. A request
recorded before forms were kept (or whose form lost a part) is rebuilt from the path alone, with
the row's model and no system prompt, tools or parameters; a session recorded before the turn
log has no rows, and each answer on its newest branch stands for one request (the path up to
it). Those are counted as ``approximate``. The store is only read.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.chat import request_form as chat_form
from gateway.messages import request_form as messages_form
from gateway.pipeline.request_form import resolved
from gateway.responses import request_form as responses_form
from store import close_stores, open_stores
from store.records import Event, SessionRecord
from gateway.settings import load_settings
from store.turns import TurnLog

FORMATS = ("chat", "responses", "messages")


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    session: str
    format: str
    body: dict[str, Any]
    tenant: str = ""  # a stored session's tenant: its requests are sent with a credential of their own

    def credential(self) -> str:
        """The replay client's key for this request's tenant (the replay gateway's tenant is its hash)."""
        if not self.tenant:
            return "sk-replay-offline"
        return "sk-replay-" + hashlib.blake2b(self.tenant.encode(), digest_size=8).hexdigest()


def load_requests(path: str) -> list[ReplayRequest]:
    """One JSON object a line: ``{"session": KEY, "format": "chat"|"responses"|"messages", "body": {...}}``,
    or the body itself with ``session`` and ``format`` fields beside its own."""
    out: list[ReplayRequest] = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object")
            body = row.get("body") if isinstance(row.get("body"), dict) else \
                {k: v for k, v in row.items() if k not in ("session", "format")}
            fmt, session = row.get("format"), row.get("session")
            if fmt not in FORMATS:
                raise ValueError(f"{path}:{n}: 'format' has value {fmt!r}: use chat, responses or messages")
            if not isinstance(session, str) or not session:
                raise ValueError(f"{path}:{n}: 'session' must be a non-empty string")
            if not isinstance(body.get("model"), str):
                raise ValueError(f"{path}:{n}: the body has no 'model'")
            if body.get("previous_response_id"):
                # The response it names lived in the recording gateway's store, not in the replay's.
                raise ValueError(f"{path}:{n}: 'previous_response_id' is set: replay needs each request's full input")
            out.append(ReplayRequest(session, fmt, body))
    return out


REBUILD = {"chat": chat_form.rebuild, "responses": responses_form.rebuild, "messages": messages_form.rebuild}
UNKNOWN_MODEL = "unknown-model"
# Messages requires max_tokens; a request rebuilt without its form gets this one.
APPROXIMATE_MAX_TOKENS = 4096


@dataclass(slots=True)
class Stored:
    """What was read from the store: the requests in order, (tenant, session key, format, body)
    each, and how many were approximate."""

    requests: list[tuple[str, str, str, dict]] = field(default_factory=list)
    sessions: int = 0
    approximate: int = 0
    approximate_sessions: set[str] = field(default_factory=set)
    windows: dict[str, int] = field(default_factory=dict)  # the newest window the gateway recorded per model


def select(sessions: list[SessionRecord], tenant: str | None, wanted: list[str]) -> list[SessionRecord]:
    """The sessions to replay, oldest first: all (of `tenant`), or those `wanted` names by key
    (tenant/hash) or session id; a name that matches none raises LookupError."""
    mine = [r for r in sessions if tenant is None or r.tenant == tenant]
    if wanted:
        chosen = []
        for name in wanted:
            found = [r for r in mine if name in (r.key, r.session_id)]
            if not found:
                raise LookupError(f"no stored session '{name}'" + (f" of tenant '{tenant}'" if tenant else ""))
            chosen.extend(r for r in found if r not in chosen)
        mine = chosen
    return sorted(mine, key=lambda r: r.created)


class Paths:
    """Paths of one session from the ledger, each event read once (a session's requests share
    their prefixes)."""

    def __init__(self, ledger, key: str) -> None:
        self.ledger, self.key = ledger, key
        self.events: dict[str, Event] = {}

    def to(self, node: str) -> list[Event]:
        out: list[Event] = []
        current: str | None = node
        while current is not None:
            event = self.events.get(current)
            if event is None:
                event = self.ledger.get(self.key, current)
                if event is None:
                    break
                self.events[current] = event
            out.append(event)
            current = event.parent
        out.reverse()
        return out


def _format_of(history: list[dict], route: str | None) -> str:
    if route in REBUILD:
        return route
    for message in reversed(history):
        fmt = (message.get("wire") or {}).get("format")
        if fmt in REBUILD:
            return fmt
    return "chat"


def approximate_body(fmt: str, model: str, history: list[dict]) -> dict[str, Any]:
    """A request rebuilt from its path alone: no system prompt, tools or parameters."""
    params: dict[str, Any] = {"model": model}
    if fmt == "messages":
        params["max_tokens"] = APPROXIMATE_MAX_TOKENS
    body, _ = REBUILD[fmt]({"params": params, "literals": [], "tail": len(history)}, history)
    return body


def session_requests(ledger, turns, record: SessionRecord, out: Stored) -> None:
    paths = Paths(ledger, record.key)
    rows = turns.session(record.key)
    parts = turns.parts(record.key) if any(r.form for r in rows) else {}
    before = len(out.requests)
    if rows:
        for row in rows:
            if row.window:
                out.windows[row.model] = row.window
            history = [e.message for e in paths.to(row.node)] if row.node else []
            if not history:
                continue  # its events are gone (a deleted branch): nothing to send
            form = resolved(row.form, parts) if row.form else None
            if form is not None and form.get("format") in REBUILD:
                body, exact = REBUILD[form["format"]](form, history)
                fmt = form["format"]
            else:
                fmt = _format_of(history, row.route)
                body, exact = approximate_body(fmt, row.model, history), False
            out.requests.append((record.tenant, record.key, fmt, body))
            if not exact:
                out.approximate += 1
                out.approximate_sessions.add(record.key)
    else:
        # Recorded before the turn log: each answer on the newest branch followed one request.
        head = ledger.heads(record.key)
        path = paths.to(head[-1]) if head else []
        history = [e.message for e in path]
        ends = [i for i, m in enumerate(history) if m.get("role") == "assistant" and i > 0]
        if history and history[-1].get("role") != "assistant":
            ends.append(len(history))
        fmt = _format_of(history, None)
        for end in ends:
            out.requests.append((record.tenant, record.key, fmt, approximate_body(fmt, record.model or UNKNOWN_MODEL, history[:end])))
            out.approximate += 1
            out.approximate_sessions.add(record.key)
    if len(out.requests) > before:
        out.sessions += 1


def stored_requests(settings, tenant: str | None, wanted: list[str]) -> Stored:
    """The requests of the configured store's sessions (all, `tenant`'s, or `wanted`), in order."""
    ledger, checkpoints = open_stores(settings.store)
    turns = TurnLog(settings.store.path, synchronous=settings.store.sync)
    try:
        out = Stored()
        for record in select(ledger.sessions(None), tenant, wanted):
            session_requests(ledger, turns, record, out)
        return out
    finally:
        turns.close()
        close_stores(ledger, checkpoints)


def stored(args: argparse.Namespace) -> list[ReplayRequest]:
    """The requests of the configured store's sessions (``--tenant``, ``--session``)."""
    settings = load_settings(args.config)
    if not Path(settings.store.path).is_dir() and not settings.store.url:
        raise LookupError(f"no store at {settings.store.path} (set store.path or --config, or use --from FILE.jsonl)")
    stored = stored_requests(settings, args.tenant, args.sessions)
    args.approximate = stored.approximate
    args.windows = {**stored.windows, **{m: s.context_window for m, s in settings.models.items() if s.context_window}}
    return [ReplayRequest(session, fmt, body, tenant) for tenant, session, fmt, body in stored.requests]
