"""Typed application keys: what the app shares between handlers (no module globals).

Each key is typed against what its readers use, not against an implementation: the stores
against the Protocols in ``store/interfaces.py`` (embedded or PostgreSQL backends fit alike),
the gateway's own collaborators against the small Protocols below. ``gateway/app.py``, the
composition root, is the one place that creates the concrete objects and puts them here
(docs/architecture.md, "The rooms").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from store.interfaces import CheckpointStore, LedgerStore, ReceiptStore, SearchIndex, TurnLogStore

if TYPE_CHECKING:
    from gateway.http.identity import Identity
    from gateway.http.routing import Upstreams
    from gateway.ops.metrics import Metrics
    from gateway.settings import Settings
    from policies import TokenCounter


class ChatHandler(Protocol):
    """POST /v1/chat/completions (``gateway.pipeline.pipeline.Pipeline`` with ``gateway.chat.peer.ChatPeer``)."""

    views: Any  # the view builder; the inspector wraps a read-only copy of it

    async def handle(self, request: web.Request) -> web.StreamResponse: ...


class SummaryJobs(Protocol):
    """The summary job queue (``gateway.jobs.summarizer.Summarizer``)."""

    @property
    def idle(self) -> bool: ...

    def after_turn(self, turn: Any, answer_event: Any) -> None: ...

    async def close(self, timeout: float) -> None: ...


class IndexKeeper(Protocol):
    """Keeps the recall index caught up with the ledger (``gateway.jobs.indexer.Indexer``)."""

    async def opened(self) -> SearchIndex: ...

    async def catch_up(self, session_key: str) -> int: ...

    def schedule(self, session_key: str) -> None: ...

    async def close(self) -> None: ...


SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
UPSTREAM: web.AppKey[Upstreams] = web.AppKey("upstream")  # every upstream, routed by model
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
IDENTITY: web.AppKey[Identity] = web.AppKey("identity")
COUNTER: web.AppKey[TokenCounter] = web.AppKey("counter")
LEDGER: web.AppKey[LedgerStore] = web.AppKey("ledger")
CHECKPOINTS: web.AppKey[CheckpointStore] = web.AppKey("checkpoints")
TURNS: web.AppKey[TurnLogStore] = web.AppKey("turns")
RECEIPTS: web.AppKey[ReceiptStore] = web.AppKey("receipts")
PIPELINE: web.AppKey[ChatHandler] = web.AppKey("pipeline")
RESPONSES: web.AppKey[Any] = web.AppKey("responses")  # gateway.responses.routes.ResponsesRoutes (its .pipeline)
MESSAGES: web.AppKey[Any] = web.AppKey("messages")  # the Pipeline with gateway.messages.peer.MessagesPeer
COUNT_TOKENS: web.AppKey[Any] = web.AppKey("count_tokens")  # gateway.messages.count_tokens.CountTokens
SUMMARIZER: web.AppKey[SummaryJobs] = web.AppKey("summarizer")
INDEXER: web.AppKey[IndexKeeper] = web.AppKey("indexer")

# Per-request facts the access log reports (never message text).
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
SESSION: web.RequestKey[str] = web.RequestKey("session", str)
MODEL: web.RequestKey[str] = web.RequestKey("model", str)
LOG_FIELDS: web.RequestKey[dict] = web.RequestKey("log_fields", dict)
# The tenant's own provider key ("" = the operator's or the client's); never logged.
UPSTREAM_KEY: web.RequestKey[str] = web.RequestKey("upstream_key", str)
# The name of the upstream serving the request ("default" for [upstream]).
UPSTREAM_NAME: web.RequestKey[str] = web.RequestKey("upstream_name", str)
# The request reads or deletes an upstream object the gateway knows to be its tenant's (a
# response it relayed): it may pass on the operator's key, whatever the route rules.
OWNED: web.RequestKey[bool] = web.RequestKey("owned", bool)
