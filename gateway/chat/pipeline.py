"""POST /v1/chat/completions: the per-request pipeline (DESIGN §2).

1. parse and validate; identify tenant and session,
2. sync the messages into the ledger (durable before the upstream call),
3-5. build the view the upstream receives (projection, compaction, recall tools, tailoring),
6. forward; resolve recall calls; stream the answer to the client as it comes,
7. record the answer, update metrics, let the summariser know.

When the view equals what the client sent, the client's body bytes are forwarded unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from gateway.chat.request import ChatRequest, parse_chat_request
from gateway.http.sse import SSEDecoder, StreamAssembler
from gateway.keys import LOG_FIELDS, MODEL, PIPELINE, REQUEST_ID, SESSION, TENANT
from gateway.http.upstream import response_headers
from gateway.chat.views import View
from store.canonical import path_ids
from store.ledger import SessionRef

log = logging.getLogger("palimpsest.chat")
ROUTE = "chat"


@dataclass(slots=True)
class Timing:
    """Where the time of one request went; overhead = total - upstream."""

    started: float = field(default_factory=time.perf_counter)
    upstream: float = 0.0

    def waiting(self, since: float) -> None:
        self.upstream += time.perf_counter() - since


@dataclass(slots=True)
class Turn:
    """One chat request on its way through the pipeline."""

    chat: ChatRequest
    ref: SessionRef | None
    model_label: str
    timing: Timing
    view: "View"
    headers: dict[str, str] = field(default_factory=dict)
    answer: dict | None = None
    usage: dict | None = None
    auth: str | None = None  # the client's Authorization, kept in memory for summary calls
    recall_calls: int = 0
    recall_rounds: int = 0
    recall_matches: dict[str, str] = field(default_factory=dict)  # this turn's search hits


class ChatPipeline:
    def __init__(self, *, settings, upstream, ledger, identity, metrics, views=None, recall=None, summaries=None,
                 calibration=None, indexer=None) -> None:
        self.calibration = calibration
        self.indexer = indexer
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.identity = identity
        self.metrics = metrics
        self.views = views
        self.recall = recall
        self.summaries = summaries
        self._session_header = settings.session.header.lower()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing = Timing()
        chat = parse_chat_request(await request.read())
        model_label = self.metrics.model_label(chat.model)
        request[MODEL] = model_label
        tenant = self.identity.tenant(request)
        ref: SessionRef | None = None
        if chat.history:
            # Hash first: the fingerprint fallback names the session by its first event.
            ids = path_ids(chat.history)
            ref = self.identity.session(request, tenant, ids[0])
            if ref is not None:
                synced = self.ledger.sync(ref, chat.history, ids, chat.model)
                chat.ids = synced.ids
                if synced.added:
                    self.metrics.ledger_events.labels("message").inc(synced.added)
        else:
            ref = self.identity.session(request, tenant, None)
        request[TENANT] = tenant
        if ref is not None:
            request[SESSION] = ref.key
        auth = request.headers.get("Authorization")
        view = await self.views.build(chat, ref, auth) if (self.views and ref) else View()
        turn = Turn(chat, ref, model_label, timing, view, auth=auth)
        turn.headers["x-request-id"] = request.get(REQUEST_ID, "")
        if ref is not None:
            turn.headers["x-palimpsest-session"] = ref.key.split("/", 1)[1]
            turn.headers["x-palimpsest-prompt-tokens-client"] = str(view.client_tokens)
            turn.headers["x-palimpsest-prompt-tokens-upstream"] = str(view.upstream_tokens)
            if view.checkpoint:
                turn.headers["x-palimpsest-checkpoint"] = view.checkpoint
        status = 502
        try:
            if view.recall_names is not None and self.recall is not None:
                response = await self.recall.respond(request, turn)
            elif chat.stream:
                response = await self._relay_stream(request, turn)
            else:
                response = await self._relay_json(request, turn)
            status = response.status
            return response
        finally:
            self._observe(turn, status)
            request[LOG_FIELDS] = {
                "tokens_client": view.client_tokens, "tokens_upstream": view.upstream_tokens,
                "upstream_ms": round(timing.upstream * 1000, 2), "recall_calls": turn.recall_calls,
            }

    # -- forwarding ------------------------------------------------------------------------

    def upstream_headers(self, request: web.Request, length: int):
        headers = self.upstream.request_headers(request.headers, drop=frozenset({self._session_header}))
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(length)
        return headers

    def post_chat(self, request: web.Request, body: bytes):
        """Open the upstream chat completion call carrying the client's headers."""
        return self.upstream.request(
            self.upstream.api, "POST", self.upstream.url("/v1/chat/completions"),
            headers=self.upstream_headers(request, len(body)), data=body,
        )

    async def _relay_json(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        body = turn.view.body(turn.chat)
        t0 = time.perf_counter()
        async with self.post_chat(request, body) as up:
            payload = await up.read()
            turn.timing.waiting(t0)
            headers = response_headers(up.headers, decoded=True)
            headers.update(turn.headers)
            if up.status == 200:
                self._learn(turn, payload)
            else:
                self.metrics.upstream_error(up.status)
            response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
        await response.prepare(request)
        await response.write_eof()
        self._record(turn)
        return response

    async def _relay_stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        body = turn.view.body(turn.chat)
        t0 = time.perf_counter()
        async with self.post_chat(request, body) as up:
            turn.timing.waiting(t0)
            headers = response_headers(up.headers, decoded=True)
            headers.update(turn.headers)
            if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                if up.status != 200:
                    self.metrics.upstream_error(up.status)
                t0 = time.perf_counter()
                payload = await up.read()
                turn.timing.waiting(t0)
                response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
                await response.prepare(request)
                await response.write_eof()
                return response
            response = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
            await response.prepare(request)
            decoder, assembler = SSEDecoder(), StreamAssembler()
            while True:
                t0 = time.perf_counter()
                chunk = await up.content.readany()
                turn.timing.waiting(t0)
                if not chunk:
                    break
                await response.write(chunk)
                for data in decoder.feed(chunk):
                    if data == "[DONE]":
                        assembler.done = True
                        continue
                    try:
                        assembler.add(orjson.loads(data))
                    except (orjson.JSONDecodeError, AttributeError, TypeError):
                        continue
            await response.write_eof()
        if assembler.finish_reason is not None:
            turn.answer = assembler.message()
            turn.usage = assembler.usage
        self._record(turn)
        return response

    # -- after the answer ------------------------------------------------------------------

    def _learn(self, turn: Turn, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
            turn.answer = data["choices"][0]["message"]
            turn.usage = data.get("usage")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            turn.answer = None

    def _record(self, turn: Turn) -> None:
        if turn.ref is None or turn.answer is None:
            return
        parent = turn.chat.ids[-1] if turn.chat.ids else None
        try:
            event = self.ledger.append(turn.ref, parent, turn.answer, defer=True)
        except Exception:
            log.exception("recording the answer failed")
            return
        if self.summaries is not None:
            self.summaries.after_turn(turn, event)
        if self.indexer is not None and turn.view.messages is not None:
            self.indexer.schedule(turn.ref.key)  # sessions that hide history will search it

    def _observe(self, turn: Turn, status: int) -> None:
        m = self.metrics
        elapsed = time.perf_counter() - turn.timing.started
        m.requests.labels(ROUTE, turn.model_label, str(status)).inc()
        m.request_seconds.labels(ROUTE, turn.model_label).observe(elapsed)
        m.upstream_seconds.labels(ROUTE, turn.model_label).observe(turn.timing.upstream)
        m.overhead_seconds.labels(ROUTE).observe(max(0.0, elapsed - turn.timing.upstream))
        view = turn.view
        if view.client_tokens:
            m.client_prompt_tokens.labels(turn.model_label).inc(view.client_tokens)
            m.upstream_prompt_tokens.labels(turn.model_label).inc(view.upstream_tokens)
            m.tokens_saved.labels(turn.model_label).inc(max(0, view.client_tokens - view.upstream_tokens))
        usage = turn.usage
        if usage and self.calibration is not None and turn.view.raw_estimate and not turn.recall_calls:
            self.calibration.observe(turn.chat.model, turn.view.raw_estimate, usage.get("prompt_tokens") or 0)
        if usage:
            m.upstream_usage_prompt_tokens.labels(turn.model_label).inc(usage.get("prompt_tokens") or 0)
            m.upstream_usage_completion_tokens.labels(turn.model_label).inc(usage.get("completion_tokens") or 0)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            m.upstream_usage_cached_tokens.labels(turn.model_label).inc(cached)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PIPELINE].handle(request)
