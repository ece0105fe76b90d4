"""The composition root: routes, middleware, and every collaborator, created once and wired here.

The only module that names concrete classes (stores, upstream, jobs, pipeline); everything
else is handed its collaborators and typed against what it uses (``gateway/keys.py``,
``store/interfaces.py``). Resources open and close in ``cleanup_ctx`` (docs/architecture.md,
"The rooms").
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path
from typing import AsyncIterator

from aiohttp import web

from gateway.ops.admin import setup_admin
from gateway.chat.peer import ChatPeer
from gateway.pipeline.limits import TenantLimits
from gateway.pipeline.quota import StorageQuota
from gateway.http.errors import Unauthorized
from gateway.http.middleware import error_middleware
from gateway.http.body import body_middleware
from gateway.http import edge, gate
from gateway.http.gate import open_route, tenant_route
from gateway.http.identity import Identity
from gateway.ops.logs import request_log_middleware
from gateway.ops.metrics import Metrics
from gateway.http.proxy import passthrough
from gateway.settings import Settings
from gateway.recall.embeddings import RemoteEmbedder
from gateway.pipeline.pipeline import Pipeline
from gateway.pipeline.recall_loop import RecallLoop
from gateway.pipeline.turn import TurnRecorder
from gateway.jobs.indexer import Indexer
from gateway.recall.tools import RecallTools
from gateway.keys import (INDEXER, CHECKPOINTS, COUNT_TOKENS, COUNTER, IDENTITY, LEDGER, MESSAGES, METRICS, PIPELINE,
                          RECEIPTS, RESPONSES, SETTINGS, SUMMARIZER, TURNS, UPSTREAM)
from gateway.ops.receipts import client_receipt
from gateway.messages.count_tokens import CountTokens
from gateway.messages.peer import MessagesPeer
from gateway.responses.compaction import Compactor
from gateway.responses.peer import ResponsesPeer
from gateway.responses.routes import ResponsesRoutes
from gateway.responses.stored import stored_response
from gateway.jobs.summarizer import Summarizer
from gateway.http.routing import Upstreams, build_upstreams
from gateway.pipeline.views import ViewBuilder
from gateway.pipeline.windows import Windows
from policies import Calibration, TokenCounter
from store import call as store_call, close_stores, open_response_ids, open_stores, sweep_expired
from store.interfaces import LedgerStore, TurnLogStore
from store.private import secure_tree
from store.turns import TurnLog


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the store answers (a replica whose database is unreachable takes no traffic).
    Each upstream is reported by name with what its newest call found; an upstream that fails
    does not make the gateway unready (its other upstreams still serve)."""
    upstreams = {u.name: u.state() for u in request.app[UPSTREAM].all()}
    try:
        await store_call(request.app[LEDGER].ping)
    except Exception:
        return web.json_response({"status": "store unreachable", "upstreams": upstreams}, status=503)
    return web.json_response({"status": "ready", "upstreams": upstreams})


log = logging.getLogger("palimpsest")


def metrics_closed(settings: Settings) -> bool:
    """With tenants and no metrics_token, /metrics answers 401 unless metrics_open says otherwise:
    its figures name tenants, models and volumes."""
    return bool(settings.tenants) and not settings.server.metrics_open


def log_metrics_exposure(settings: Settings) -> None:
    """One line at start when /metrics is open to anyone who can reach the port."""
    if settings.server.metrics_token.get_secret_value() or metrics_closed(settings):
        return
    level = logging.WARNING if settings.tenants else logging.INFO
    log.log(level, "/metrics is open to anyone who can reach this port: set server.metrics_token to require a token")


async def metrics_endpoint(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    token = settings.server.metrics_token.get_secret_value()
    given = request.headers.get("Authorization", "")
    if token and not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode()):
        raise Unauthorized("/metrics requires server.metrics_token (Authorization: Bearer <token>).")
    if not token and metrics_closed(settings):
        raise Unauthorized("/metrics is closed: tenants are configured and server.metrics_token is not set "
                           "(or set server.metrics_open = true).")
    metrics = request.app[METRICS]
    ledger = request.app[LEDGER]
    metrics.store_bytes.labels("ledger").set(await store_call(ledger.volume_bytes))
    metrics.store_sessions.set(await store_call(ledger.session_count))
    metrics.store_bytes.labels("checkpoints").set(await store_call(request.app[CHECKPOINTS].volume_bytes))
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PIPELINE].handle(request)


async def handle_responses(request: web.Request) -> web.StreamResponse:
    return await request.app[RESPONSES].handle(request)


async def handle_compact(request: web.Request) -> web.StreamResponse:
    return await request.app[RESPONSES].compact(request)


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await request.app[MESSAGES].handle(request)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await request.app[COUNT_TOKENS].handle(request)


def create_app(settings: Settings) -> web.Application:
    app = web.Application(
        middlewares=[request_log_middleware, error_middleware, body_middleware],
        client_max_size=int(settings.server.max_body_mb * 1024 * 1024),
        handler_args=edge.handler_args(settings.server),  # keep-alive (bounds an unfinished request head), protocol log
    )
    edge.install(app)  # parser rejections in the OpenAI envelope too, and a deadline on reading a body
    app[SETTINGS] = settings
    app[METRICS] = Metrics(known_models=list(settings.models),
                           prices={k: v.price_fields() for k, v in settings.models.items()})
    tenants = settings.tenant_table()
    app[IDENTITY] = Identity(
        {name: t.key.get_secret_value() for name, t in tenants.items()},
        settings.session.header,
        settings.session.fallback,
        require_key=settings.server.client_keys == "required"
        or (settings.server.client_keys == "auto" and bool(operator_keys(settings))),
        upstream_keys={name: t.upstream_key.get_secret_value() for name, t in tenants.items()},
        admin_token=settings.server.admin_token.get_secret_value(),
        client_headers=tuple(settings.session.headers),
    )
    app.cleanup_ctx.append(_resources)
    # Every route passes a gate (gateway/http/gate.py): the tenant's, the operator's, or open.
    app.router.add_get("/healthz", open_route(healthz))
    app.router.add_get("/readyz", open_route(readyz))
    app.router.add_get("/metrics", open_route(metrics_endpoint))  # its own token (server.metrics_token)
    app.router.add_post("/v1/chat/completions", tenant_route(handle_chat))
    app.router.add_post("/v1/responses", tenant_route(handle_responses))
    app.router.add_post("/v1/responses/compact", tenant_route(handle_compact))
    app.router.add_post("/v1/messages", tenant_route(handle_messages))
    app.router.add_post("/v1/messages/count_tokens", tenant_route(handle_count_tokens))
    app.router.add_route("GET", "/v1/responses/{response_id}", tenant_route(stored_response))
    app.router.add_route("DELETE", "/v1/responses/{response_id}", tenant_route(stored_response))
    app.router.add_route("GET", "/v1/responses/{response_id}/{tail:input_items}", tenant_route(stored_response))
    app.router.add_get("/v1/palimpsest/receipts/{receipt_id}", tenant_route(client_receipt))  # the gateway's own: never forwarded
    app.router.add_route("*", "/v1/{tail:.*}", tenant_route(passthrough))
    setup_admin(app)
    gate.check(app)
    return app


def operator_keys(settings: Settings) -> list[str]:
    """The names of the operator's own credentials that are set: any of them spent on a
    client's behalf makes client keys required in ``client_keys = "auto"``."""
    keys = {
        "upstream.api_key": settings.upstream.api_key.get_secret_value(),
        "policy.summary_api_key": settings.policy.summary_api_key or "",
        "recall.embeddings_api_key": settings.recall.embeddings_api_key.get_secret_value(),
    }
    keys |= {f"tenants.{name}.upstream_key": t.upstream_key.get_secret_value() for name, t in settings.tenant_table().items()}
    keys |= {f"tenants.{name}.upstream_keys.{u}": k.get_secret_value() for name, t in settings.tenant_table().items()
             for u, k in t.upstream_keys.items()}
    keys |= {f"upstreams.{name}.api_key": u.api_key.get_secret_value() for name, u in settings.upstreams.items()}
    keys |= {f"policies[{i}].summary_api_key": o.policy.get("summary_api_key") or "" for i, o in enumerate(settings.policies)}
    return [name for name, value in keys.items() if value]


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    log_metrics_exposure(settings)
    upstream = build_upstreams(settings)  # [upstream] and every [upstreams.NAME], routed by model
    await upstream.start()
    ledger, checkpoints = open_stores(settings.store)  # embedded, or PostgreSQL with store.url
    counter, calibration = TokenCounter(), Calibration()
    metrics = app[METRICS]
    windows = Windows({k: v.context_window for k, v in settings.models.items() if v.context_window}, upstream)
    summarizer = Summarizer(
        upstream=upstream, checkpoints=checkpoints, counter=counter, metrics=metrics,
        workers=settings.summary.workers, queue_size=settings.summary.queue_size, windows=windows,
        config=settings.summary, ledger=ledger,
    )
    await summarizer.start()
    views = ViewBuilder(
        settings=settings, windows=windows,
        counter=counter, calibration=calibration, checkpoints=checkpoints, metrics=metrics, summarizer=summarizer,
    )
    app[UPSTREAM] = upstream
    app[LEDGER] = ledger
    app[CHECKPOINTS] = checkpoints
    app[COUNTER] = counter
    app[SUMMARIZER] = summarizer
    indexer = Indexer(ledger, lambda: open_index(settings, upstream), batch_s=settings.recall.index_batch_s)
    turns = TurnLog(settings.store.path, synchronous=settings.store.sync)  # what each request was built on
    app[TURNS] = turns
    app[RECEIPTS] = turns  # each request's receipt, kept as long as its session (gateway/ops/receipts.py)
    recorder = TurnRecorder(ledger=ledger, metrics=metrics, summaries=summarizer, indexer=indexer, calibration=calibration,
                            turns=turns, views=views, receipts=turns)
    recall_tools = RecallTools(ledger, indexer, metrics, settings.recall.search_limit,
                               passage_tokens=settings.recall.passage_tokens,
                               auto_tokens=settings.recall.auto_tokens,
                               auto_placement=settings.recall.auto_placement,
                               auto_timeout_s=settings.recall.auto_timeout_s,
                               expand_queries=settings.recall.expand_queries)
    # One recall loop for every format: the turn's format peer writes its bodies and reads its answers.
    recall = RecallLoop(views=views, tools=recall_tools, recorder=recorder, max_rounds=settings.recall.max_rounds,
                        metrics=metrics)
    quota = StorageQuota(ledger, settings.store.max_stored_mb,
                         {name: t.max_stored_mb for name, t in settings.tenant_table().items()})
    limits = TenantLimits(settings.limits, settings.tenant_table())
    response_ids = open_response_ids(settings.store, ledger)  # shared by replicas with store.url
    if not settings.store.url:  # the embedded store: 0700/0600, an existing store's modes fixed (store/private.py)
        secure_tree(settings.store.path)
    # One Pipeline class; each format's own steps are its peer's (gateway/<format>/peer.py).
    parts = dict(settings=settings, upstream=upstream, ledger=ledger, identity=app[IDENTITY], metrics=metrics,
                 views=views, recorder=recorder, quota=quota, loop=recall, limits=limits)
    app[PIPELINE] = Pipeline(ChatPeer(), **parts)
    app[RESPONSES] = ResponsesRoutes(  # previous_response_id, compaction, stored ids around its pipeline
        Pipeline(ResponsesPeer(response_ids=response_ids, metrics=metrics), **parts), response_ids=response_ids,
        compactor=Compactor(ledger=ledger, checkpoints=checkpoints, summarizer=summarizer, views=views,
                            secret=await store_call(response_ids.secret)))
    app[MESSAGES] = Pipeline(MessagesPeer(), **parts)
    app[COUNT_TOKENS] = CountTokens(app[MESSAGES])
    app[INDEXER] = indexer
    flusher = asyncio.create_task(_flush_answers(ledger, turns), name="ledger-flush")
    retention = (asyncio.create_task(_retention(settings.store.retention_days, ledger, checkpoints, indexer, turns, response_ids), name="retention")
                 if settings.store.retention_days else None)
    try:
        yield
    finally:
        flusher.cancel()
        if retention is not None:
            retention.cancel()
        # In-flight requests are drained by the server before cleanup; then summary jobs.
        await summarizer.close(settings.server.shutdown_timeout_s)
        await indexer.close()
        await upstream.close()
        response_ids.close()
        close_stores(ledger, checkpoints)
        turns.close()


def open_index(settings: Settings, upstream: Upstreams | None):
    """The recall index under store.path with the configured embedder (imports LanceDB)."""
    from store.embedders import default_embedder
    from store.index import SearchIndex

    recall = settings.recall
    if recall.embeddings_url and upstream is not None:
        embedder = RemoteEmbedder(upstream.default, recall.embeddings_url, recall.embeddings_model,
                                  recall.embeddings_api_key.get_secret_value(), recall.embeddings_dim)
    elif recall.embedder == "minilm":
        from store.minilm import MiniLMEmbedder

        embedder = MiniLMEmbedder()
    else:
        embedder = default_embedder()
    return SearchIndex(recall.index_uri or str(Path(settings.store.path) / "index"), embedder,
                       storage_options=index_storage_options(recall), shared=bool(settings.store.url),
                       cache_bytes=recall.index_cache_mb * 2**20)


def index_storage_options(recall) -> dict[str, str] | None:
    """LanceDB storage options for an s3:// index_uri on an S3-compatible store."""
    if not recall.index_uri.startswith("s3://"):
        return None
    options = {"region": recall.index_region}
    if recall.index_endpoint:
        options["endpoint"] = recall.index_endpoint
        options["allow_http"] = str(recall.index_endpoint.startswith("http://")).lower()
        options["aws_virtual_hosted_style_request"] = "false"
    if recall.index_access_key_id.get_secret_value():
        options["aws_access_key_id"] = recall.index_access_key_id.get_secret_value()
        options["aws_secret_access_key"] = recall.index_secret_access_key.get_secret_value()
    return options


async def _retention(days: float, ledger, checkpoints, indexer, turns, responses, every_s: float = 3600.0) -> None:
    """The retention TTL: hourly, delete sessions idle for more than `days` (store.__init__)."""
    while True:
        try:
            index = await indexer.opened()
            await sweep_expired(days, ledger=ledger, checkpoints=checkpoints, index=index, turns=turns, responses=responses)
        except Exception:
            logging.getLogger("palimpsest.store").exception("retention sweep failed")
        await asyncio.sleep(every_s)


async def _flush_answers(ledger: LedgerStore, turns: TurnLogStore, every_s: float = 0.5, checkpoint_every: int = 10) -> None:
    """Deferred answers (and the turn log's rows) reach the disk within `every_s` even when no
    request comes, and the WAL is checkpointed off the event loop every few seconds."""
    log = logging.getLogger("palimpsest.ledger")
    ticks = 0
    while True:
        await asyncio.sleep(every_s)
        ticks += 1
        try:
            await store_call(ledger.flush)
            await asyncio.to_thread(turns.flush)  # receipts and rows: an executemany and its WAL work, off the loop
            if ticks % checkpoint_every == 0:
                await asyncio.to_thread(ledger.checkpoint)
        except Exception:
            log.exception("ledger maintenance failed")
