"""The request steps every wire format's pipeline shares (docs/architecture.md, "Wire formats").

``WirePipeline`` runs one request of an adapter's API on the neutral model: the storage quota,
the view, the ledger sync (after the view, so a request refused for the window stores nothing;
durable before the upstream call), the view (shared ``ViewBuilder``), the turn's headers, the
choice between the recall loop and the plain relay, and what is observed and logged at the end.
The plain relay forwards the client's bytes when the view is unchanged (else the rendered view),
streams the upstream's bytes to the client as they come and reads the stream on the side
(``StreamWatch``) for the answer to record. A subclass names its route and path and supplies
what is its format's own: parsing, rendering, reading an answer, the stream watcher and how a
started stream ends with an error.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from gateway.pipeline import offload
from gateway.pipeline.fork import Forker
from gateway.pipeline.adapter import RecallFormat
from gateway.pipeline.bypass import BYPASS_HEADER, bypass_reason
from gateway.pipeline.quota import StorageQuota
from gateway.pipeline.relay import DONE, upstream_events
from gateway.pipeline.turn import Timing, Turn, TurnRecorder
from gateway.pipeline.views import View, ViewBuilder
from gateway.http.errors import GatewayError, UpstreamIncomplete
from gateway.http.gate import tenant_of
from gateway.http.identity import Identity
from gateway.http.routing import Upstreams
from gateway.http.upstream import response_headers
from gateway.ops.receipts import RECEIPT_HEADER, new_receipt_id
from gateway.keys import LOG_FIELDS, MODEL, REQUEST_ID, SESSION, TENANT, UPSTREAM_KEY, UPSTREAM_NAME
from gateway.settings import DEFAULT_UPSTREAM
from store import call as store_call
from store.records import SessionRef


# A request this long is synced in a worker thread even when its body is small.
BIG_SYNC_MESSAGES = 2000

class StreamWatch:
    """Reads a relayed stream's events on the side: ``feed`` each one (it may raise the
    provider's error event as a GatewayError); ``final`` is the complete answer once the stream
    says it is complete, else None."""

    final: dict | None = None

    def feed(self, event: dict) -> None:
        raise NotImplementedError

    def done(self) -> None:
        """The stream's ``data: [DONE]`` sentinel (Chat Completions ends its streams with it)."""


class WirePipeline:
    route = "chat"
    path = "/v1/chat/completions"
    credentials: tuple[str, ...] = ("Authorization", "api-key")

    def __init__(self, *, settings, upstream: Upstreams, ledger, identity: Identity, metrics, views: ViewBuilder,
                 recorder: TurnRecorder, quota=None, loop=None, limits=None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.identity = identity
        self.metrics = metrics
        self.views = views
        self.recorder = recorder
        self.quota = quota  # per-tenant storage quotas (gateway/pipeline/quota.py)
        self.loop = loop  # the recall loop (gateway/pipeline/recall_loop.py), one for every format
        self.limits = limits  # per-tenant caps and request rate (gateway/pipeline/limits.py)
        self._drop = frozenset({settings.session.header.lower(), BYPASS_HEADER})
        self._bypass_tenants = frozenset(name for name, t in settings.tenant_table().items() if t.bypass)

    # -- the format's own ---------------------------------------------------------------------

    def parse_and_hash(self, raw: bytes):
        """(ChatRequest, path ids) of a body; 400 in the format's envelope on what cannot be routed."""
        raise NotImplementedError

    def render(self, turn: Turn) -> bytes:
        """The upstream body for a turn whose view changed the conversation."""
        raise NotImplementedError

    def learn(self, turn: Turn, data: dict) -> None:
        """Take the answer (and usage) to record from a complete answer object."""
        raise NotImplementedError

    def watch(self) -> StreamWatch:
        raise NotImplementedError

    async def end_stream(self, response: web.StreamResponse, error: GatewayError) -> None:
        """Tell `error` as the last event of a started stream and close the connection."""
        raise NotImplementedError

    def upstream_path(self, request: web.Request) -> str:
        return self.path

    # The format's translation for a chat-only model (a ``chat_transport.ChatTransport``), or None.
    through_chat = None
    # The format's ``request_form.skeleton`` (what of a request the ledger does not hold), or None.
    request_form = None

    def wire_count(self, turn: Turn) -> int | None:
        """The prompt tokens of the turn's first upstream body as this format's adapter reads it
        back, when that differs from counting the neutral view (the receipt itemises it)."""
        return None

    def transport(self, model: str):
        """The upstream client for `model` (``post`` and ``reader``): the upstream that serves it,
        seen through Chat Completions for a model configured with ``api = "chat"``."""
        upstream = self.upstream.for_model(model)
        configured = self.settings.models.get(model)
        if self.through_chat is not None and configured is not None and configured.api == "chat":
            return self.through_chat(upstream)
        return upstream

    async def record(self, turn: Turn, tenant: str | None = None) -> None:
        await self.recorder.answer(turn)

    def forker(self, request: web.Request) -> Forker | None:
        """The format's cache fork of a turn's view for its summary call (None: that format
        has none, and a summary reads the transcript instead)."""
        return None
    # The format's answers for the recall loop (its recall.py): this pipeline is the loop's adapter.
    recall_format: RecallFormat

    def recall_body(self, turn: Turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        return self.recall_format.body(turn, messages, with_recall, stream)

    def json_turn(self, turn: Turn):
        return self.recall_format.json_turn(turn)

    def recall_stream(self, turn: Turn):
        return self.recall_format.stream(turn)

    def recalls(self, turn: Turn) -> bool:
        """Whether the recall loop serves this turn (its view carries the recall tools)."""
        return turn.view.recall_names is not None

    # -- shared steps --------------------------------------------------------------------------

    async def parsed(self, raw: bytes):
        return await offload.parse_and_hash(raw, self.parse_and_hash)

    def auth(self, request: web.Request) -> dict[str, str] | None:
        """The client's credential headers, kept in memory for the gateway's own calls."""
        return {h: v for h in self.credentials if (v := request.headers.get(h))} or None

    async def admit(self, request: web.Request, chat, ids: list[str], ref: SessionRef | None) -> None:
        """Before anything is built or stored: the session named, the tenant within its storage
        quota (429)."""
        if ref is None:
            return
        request[SESSION] = ref.key
        chat.ids = ids
        if self.quota is not None and ids:
            await self.quota.check(ref.tenant)

    async def sync(self, request: web.Request, chat, ids: list[str], ref: SessionRef | None) -> None:
        """The conversation into the ledger: after the view is built (a request refused for the
        window leaves nothing behind), before anything goes upstream."""
        if ref is not None and ids:
            await sync_history(self.ledger, self.metrics, self.quota, ref, chat, ids)

    async def view(self, chat, ref: SessionRef | None, auth) -> View:
        return await offload.build_view(self.views, chat, ref, auth) if ref is not None and chat.ids else View()

    def bypass(self, request: web.Request, tenant: str) -> str | None:
        """Why this request goes upstream untouched (gateway/pipeline/bypass.py), counted."""
        reason = bypass_reason(request, tenant, self._bypass_tenants)
        if reason is not None:
            self.metrics.bypassed.labels(self.route, reason).inc()
        return reason

    def turn(self, request: web.Request, chat, ref: SessionRef | None, timing: Timing, view: View, auth,
             bypass: str | None = None) -> Turn:
        turn = Turn(chat, ref, request[MODEL], timing, view, auth=auth, route=self.route, bypass=bypass,
                    wire_count=self.wire_count, request_form=self.request_form,
                    upstream=request.get(UPSTREAM_NAME, DEFAULT_UPSTREAM),
                    fork=self.forker(request))
        turn.headers["x-request-id"] = request.get(REQUEST_ID, "")
        if ref is not None:
            turn.receipt = new_receipt_id()
            turn.headers[RECEIPT_HEADER] = turn.receipt
            turn.headers["x-palimpsest-session"] = ref.session_id
            view_headers(turn)
        return turn

    async def start(self, request: web.Request):
        """(timing, tenant, chat, ids): the first steps of every request."""
        timing = Timing()
        tenant = tenant_of(request)  # resolved by the route's gate (a 401 for a missing/unknown client key)
        if self.limits is not None:
            self.limits.admit(tenant)  # 429 over the tenant's rate, before the body is read
        chat, ids = await self.parsed(await request.read())
        if self.limits is not None:
            self.limits.check(tenant, chat.body, chat.format)  # 400 over its n / output-token caps
        request[MODEL] = self.metrics.model_label(chat.model)
        request[TENANT] = tenant
        self.upstream.route(request, tenant, chat.model)  # which upstream, and the tenant's key for it
        return timing, tenant, chat, ids

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing, tenant, chat, ids = await self.start(request)
        bypass = self.bypass(request, tenant)
        ref = self.identity.session(request, tenant, ids[0] if ids else None)
        await self.admit(request, chat, ids, ref)
        auth = self.auth(request)
        view = View() if bypass else await self.view(chat, ref, auth)
        await self.sync(request, chat, ids, ref)
        return await self.serve(request, self.turn(request, chat, ref, timing, view, auth, bypass))

    async def serve(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """The recall loop when the view carries recall tools, else the plain relay; observed
        and logged whatever happens."""
        try:
            if self.recalls(turn):
                if await self.loop.recall_ahead(turn):
                    view_headers(turn)  # the view grew by a proactive recall block: its figures moved
                response = await self.loop.respond(request, turn, self)  # this pipeline is the loop's RecallAdapter
            else:
                response = await self.relay(request, turn)
            if turn.failure is None:
                turn.status = response.status
            return response
        except GatewayError as exc:
            turn.status = exc.status  # rendered (and counted by kind) by the error middleware
            raise
        finally:
            self.recorder.observe(turn)
            view = turn.view
            request[LOG_FIELDS] = {"tokens_client": view.client_tokens, "tokens_upstream": view.upstream_tokens,
                                   "upstream_ms": round(turn.timing.upstream * 1000, 2), "recall_calls": turn.recall_calls}
            if turn.failure is not None:  # the status line said 200; the stream ended with this error
                request[LOG_FIELDS]["stream_error"] = turn.failure.code

    # -- the plain relay -----------------------------------------------------------------------

    def body(self, turn: Turn) -> bytes:
        return turn.chat.raw if turn.view.messages is None else self.render(turn)

    async def relay(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        t0 = time.perf_counter()
        response: web.StreamResponse | None = None
        transport = self.transport(turn.chat.model)
        try:
            async with transport.post(self.upstream_path(request), request.headers, self.body(turn), drop=self._drop,
                                      tenant_key=request.get(UPSTREAM_KEY, "")) as up:
                turn.timing.waiting(t0)
                reader = transport.reader(up)
                headers = response_headers(up.headers, decoded=True)
                headers.update(turn.headers)
                if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                    if up.status != 200:
                        self.metrics.upstream_error(up.status)
                    t0 = time.perf_counter()
                    payload = await reader.read()
                    turn.timing.waiting(t0)
                    if up.status == 200:
                        self._learn_payload(turn, payload)
                        self.recorder.bill(turn)
                        if turn.billed is not None:  # known before the body goes out: JSON answers only
                            headers["x-palimpsest-cached-tokens"] = str(turn.billed.cached)
                    response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
                    await self.record(turn, request.get(TENANT))  # durable before the client has it
                    await response.prepare(request)
                    await response.write_eof()
                    return response
                response = web.StreamResponse(status=200, reason=up.reason, headers=headers)
                await response.prepare(request)
                watch = await self._pump(reader, response, turn)
                if watch.final is None:
                    raise UpstreamIncomplete("The upstream's stream ended before the answer was complete.")
                self.learn(turn, watch.final)
                await self.record(turn, request.get(TENANT))  # durable before the stream ends
                await response.write_eof()
        except GatewayError as exc:
            return await self.stream_failed(response, turn, exc)
        return response

    async def stream_failed(self, response: web.StreamResponse | None, turn: Turn, error: GatewayError) -> web.StreamResponse:
        """`error` before the client's stream started goes up to the error middleware; after,
        the answer is incomplete (not recorded) and the stream ends with the format's error event."""
        if response is None or not response.prepared:
            raise error
        self.recorder.failed_in_stream(turn, error)
        await self.end_stream(response, error)
        return response

    async def _pump(self, reader, response: web.StreamResponse, turn: Turn) -> StreamWatch:
        """Relay the upstream's bytes as they come; the answer read on the side."""
        watch = self.watch()
        async for chunk, events in upstream_events(reader, turn.timing):
            await response.write(chunk)
            for event in events:
                if event is DONE:
                    watch.done()
                else:
                    watch.feed(event)
        return watch

    def _learn_payload(self, turn: Turn, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(data, dict):
            self.learn(turn, data)


async def sync_history(ledger, metrics, quota: StorageQuota | None, ref, chat, ids: list[str]) -> None:
    """The request's messages into the ledger; a big request's in a worker thread (the
    embedded ledger then answers the event loop's own writes from threads too)."""
    if (offload.is_big(chat.raw) or len(ids) >= BIG_SYNC_MESSAGES) and not offload.light_sync(ledger, ref, chat, ids):
        synced = await asyncio.to_thread(ledger.sync, ref, chat.history, ids, chat.model)
    else:
        synced = await store_call(ledger.sync, ref, chat.history, ids, chat.model)  # off the loop on PostgreSQL
    chat.ids, chat.added = synced.ids, synced.added  # added: the summary cost model tells an arrival by it
    if synced.added:
        metrics.ledger_events.labels("message").inc(synced.added)
        if quota is not None:
            quota.stored(ref.tenant, stored_bytes(chat.history[-synced.added:]))


def stored_bytes(messages: list[dict]) -> int:
    """About what the ledger stores for `messages` (their JSON), for the storage quota."""
    return sum(len(orjson.dumps(m)) for m in messages)


def view_headers(turn: Turn) -> None:
    """The view's figures as the turn's ``x-palimpsest-*`` headers."""
    view, headers = turn.view, turn.headers
    headers["x-palimpsest-prompt-tokens-client"] = str(view.client_tokens)
    headers["x-palimpsest-prompt-tokens-upstream"] = str(view.upstream_tokens)
    if view.checkpoint:
        headers["x-palimpsest-checkpoint"] = view.checkpoint
    for name, value in (("x-palimpsest-truncated-tool-results", view.truncated_tool_results or None),
                        ("x-palimpsest-truncated-last-message", "true" if view.truncated_last_message else None)):
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = str(value)
