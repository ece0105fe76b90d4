"""Typed application keys for what the app shares between handlers (no module globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from gateway.chat.pipeline import ChatPipeline
    from gateway.http.identity import Identity
    from gateway.ops.metrics import Metrics
    from gateway.settings import Settings
    from gateway.jobs.indexer import Indexer
    from gateway.jobs.summarizer import Summarizer
    from gateway.http.upstream import Upstream
    from policies import TokenCounter
    from store.checkpoints import DiskCheckpoints
    from store.ledger import Ledger
    from store.turns import TurnLog

SETTINGS: web.AppKey["Settings"] = web.AppKey("settings")
UPSTREAM: web.AppKey["Upstream"] = web.AppKey("upstream")
METRICS: web.AppKey["Metrics"] = web.AppKey("metrics")
LEDGER: web.AppKey["Ledger"] = web.AppKey("ledger")
IDENTITY: web.AppKey["Identity"] = web.AppKey("identity")
PIPELINE: web.AppKey["ChatPipeline"] = web.AppKey("pipeline")
CHECKPOINTS: web.AppKey["DiskCheckpoints"] = web.AppKey("checkpoints")
COUNTER: web.AppKey["TokenCounter"] = web.AppKey("counter")
SUMMARIZER: web.AppKey["Summarizer"] = web.AppKey("summarizer")
INDEXER: web.AppKey["Indexer"] = web.AppKey("indexer")
TURNS: web.AppKey["TurnLog"] = web.AppKey("turns")

# Per-request facts the access log reports (never message text).
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
TENANT: web.RequestKey[str] = web.RequestKey("tenant", str)
SESSION: web.RequestKey[str] = web.RequestKey("session", str)
MODEL: web.RequestKey[str] = web.RequestKey("model", str)
LOG_FIELDS: web.RequestKey[dict] = web.RequestKey("log_fields", dict)
