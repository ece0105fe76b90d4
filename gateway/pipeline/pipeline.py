"""The one request path every wire format takes (docs/architecture.md, "A request's path").

``Pipeline(peer)`` runs one request of a format's API on the neutral model: the storage quota,
the view (shared ``ViewBuilder``), the ledger sync (after the view, so a request refused for
the window stores nothing; durable before the upstream call), the turn's headers, the choice
between the recall loop and the plain relay, and what is observed and logged at the end. The
plain relay forwards the client's bytes when the view is unchanged (else the rendered view),
streams the upstream's bytes to the client as they come and reads the stream on the side
(``StreamWatch``) for the answer to record. What is the format's own (parsing, rendering,
reading an answer, the stream watcher, the error event of a started stream) is its peer's
(``gateway/pipeline/adapter.FormatPeer``), handed in by the composition root (``gateway/app.py``);
nothing subclasses the pipeline. Routes only one API has (``/v1/responses/compact``, stored
responses, ``count_tokens``) live in its room and call these steps.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gateway.pipeline import offload
from gateway.pipeline.adapter import FormatPeer
from gateway.pipeline.bypass import BYPASS_HEADER, bypass_reason
from gateway.pipeline.quota import StorageQuota
from gateway.pipeline.relay import relay_stream, streamed
from gateway.pipeline.turn import Timing, Turn, TurnRecorder
from gateway.pipeline.views import View, ViewBuilder
from gateway.http.errors import GatewayError, UpstreamIncomplete
from gateway.http.gate import tenant_of
from gateway.http.identity import Identity
from gateway.http.routing import Upstreams
from gateway.http.sse import end_stream
from gateway.http.upstream import response_headers
from gateway.ops.receipts import RECEIPT_HEADER, new_receipt_id
from gateway.keys import LOG_FIELDS, MODEL, REQUEST_ID, SESSION, TENANT, UPSTREAM_KEY, UPSTREAM_NAME
from gateway.settings import DEFAULT_UPSTREAM, Settings
from store import call as store_call
from store.records import SessionRef


# A request this long is synced in a worker thread even when its body is small.
BIG_SYNC_MESSAGES = 2000


@dataclass(eq=False, kw_only=True)
class Pipeline:
    peer: FormatPeer = field(kw_only=False)  # what is the format's own (gateway/<format>/peer.py)
    settings: Settings
    upstream: Upstreams
    ledger: Any  # store.interfaces.LedgerStore
    identity: Identity
    metrics: Any  # gateway.ops.metrics.Metrics
    views: ViewBuilder
    recorder: TurnRecorder
    quota: StorageQuota | None = None  # per-tenant storage quotas (gateway/pipeline/quota.py)
    loop: Any = None  # the recall loop (gateway/pipeline/recall_loop.py), one for every format
    limits: Any = None  # per-tenant caps and request rate (gateway/pipeline/limits.py)

    def __post_init__(self) -> None:
        self.route = self.peer.route
        self.drop = frozenset({self.settings.session.header.lower(), BYPASS_HEADER})  # the gateway's own headers: never upstream
        self._bypass_tenants = frozenset(name for name, t in self.settings.tenant_table().items() if t.bypass)

    def via_chat(self, model: str) -> bool:
        """Whether `model` is configured with ``api = "chat"`` and the format has a translation for it."""
        configured = self.settings.models.get(model)
        return self.peer.through_chat is not None and configured is not None and configured.api == "chat"

    def transport(self, turn: Turn):
        """The upstream client for the turn (``post`` and ``reader``): the upstream that serves its
        model, seen through Chat Completions when the turn goes to a chat-only model (``via_chat``)."""
        upstream = self.upstream.for_model(turn.chat.model)
        return self.peer.through_chat(upstream) if turn.via_chat else upstream

    async def record(self, turn: Turn, tenant: str | None = None) -> None:
        await self.recorder.answer(turn)
        await self.peer.recorded(turn, tenant)

    async def answer(self, request: web.Request, turn: Turn, response: web.Response, *, record: bool = True) -> web.Response:
        """A whole (not streamed) answer to the client, its turn recorded first when `record`
        (durable before the client has it; a turn without a complete answer records nothing)."""
        if record:
            await self.record(turn, request.get(TENANT))
        await self.end(request, turn, response)
        return response

    async def end(self, request: web.Request, turn: Turn, response: web.StreamResponse) -> None:
        """The response's end to the client, then the recorded turn's bookkeeping
        (``TurnRecorder.booked``). Neither ``prepare`` nor ``write_eof`` yields to the event loop
        unless the socket's buffer is full, so nothing else runs between the last byte and it."""
        try:
            if not response.prepared:
                await response.prepare(request)
            await response.write_eof()
        finally:
            self.recorder.booked(turn)

    # -- shared steps --------------------------------------------------------------------------

    async def parsed(self, raw: bytes):
        """(the neutral request, its history's ids), off the event loop for a big body."""
        return await offload.parse_and_hash(raw, self.peer)

    def auth(self, request: web.Request) -> dict[str, str] | None:
        """The client's credential headers, kept in memory for the gateway's own calls."""
        return {h: v for h in self.peer.credentials if (v := request.headers.get(h))} or None

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
        peer = self.peer
        turn = Turn(chat, ref, request[MODEL], timing, view, auth=auth, route=self.route, bypass=bypass, peer=peer,
                    upstream=request.get(UPSTREAM_NAME, DEFAULT_UPSTREAM), via_chat=self.via_chat(chat.model))
        if peer.fork_headers:
            turn.fork_headers = {h: v for h in peer.fork_headers if (v := request.headers.get(h))}
            turn.query = request.query_string
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
        return await self.proceed(request, timing, chat, ids, ref, bypass)

    async def proceed(self, request: web.Request, timing: Timing, chat, ids: list[str], ref: SessionRef | None,
                      bypass: str | None, *, rewritten: bool = False) -> web.StreamResponse:
        """From an admitted request on: the view, the ledger sync, the upstream. `rewritten`: the
        history is no longer the client's input as it came, so it is rendered even when the view
        leaves it whole."""
        auth = self.auth(request)
        view = View() if bypass else await self.view(chat, ref, auth)
        if rewritten and view.messages is None:
            view.messages = [*chat.instructions, *chat.history]
        await self.sync(request, chat, ids, ref)
        return await self.serve(request, self.turn(request, chat, ref, timing, view, auth, bypass))

    async def forward(self, request: web.Request, timing: Timing, chat, path: str) -> web.StreamResponse:
        """A request to another path of the format's API that the gateway neither rewrites nor
        records (``/v1/responses/compact`` without a session): the client's body to `path` on its
        model's upstream through the plain relay, with the same headers, key, metrics and log
        line as any request, and the upstream's answer (an error included) as it came."""
        turn = self.turn(request, chat, None, timing, View(), self.auth(request))
        turn.path, turn.via_chat = path, False  # the provider's own endpoint: no chat-only translation
        return await self.serve(request, turn)

    async def serve(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """The recall loop when the view carries recall tools, else the plain relay; observed
        and logged whatever happens."""
        try:
            if self.peer.recalls(turn):
                if await self.loop.recall_ahead(turn):
                    view_headers(turn)  # the view grew by a proactive recall block: its figures moved
                response = await self.loop.respond(request, turn, self)
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

    @asynccontextmanager
    async def call(self, request: web.Request, turn: Turn, body: bytes):
        """One upstream call of the turn, the plain relay's or a recall round's: `body` to the
        turn's path on its transport, with the client's headers (but the gateway's own) and the
        tenant's key; yields (the response, its reader), the wait for its head counted as the
        upstream's time."""
        transport = self.transport(turn)
        t0 = time.perf_counter()
        async with transport.post(turn.path or self.peer.upstream_path(request), request.headers, body, drop=self.drop,
                                  tenant_key=request.get(UPSTREAM_KEY, "")) as up:
            turn.timing.waiting(t0)
            yield up, transport.reader(up)

    async def relay(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        response: web.StreamResponse | None = None
        try:
            async with self.call(request, turn, self.peer.body(turn)) as (up, reader):
                headers = response_headers(up.headers, decoded=True)
                headers.update(turn.headers)
                if not streamed(up):
                    if up.status != 200:
                        self.metrics.upstream_error(up.status)
                    payload = await reader.read(turn.timing)
                    if up.status == 200 and not turn.path:
                        self._learn_payload(turn, payload)
                        self.recorder.bill(turn)
                        if turn.billed is not None:  # known before the body goes out: JSON answers only
                            headers["x-palimpsest-cached-tokens"] = str(turn.billed.cached)
                    return await self.answer(request, turn, web.Response(status=up.status, reason=up.reason, body=payload,
                                                                         headers=headers))
                response = web.StreamResponse(status=200, reason=up.reason, headers=headers)
                await response.prepare(request)
                watch = self.peer.watch()  # the answer read on the side
                await relay_stream(reader, response, watch, turn.timing, passthrough=True)
                if watch.final is None:
                    raise UpstreamIncomplete("The upstream's stream ended before the answer was complete.")
                self.peer.learn(turn, watch.final)
                await self.record(turn, request.get(TENANT))  # durable before the stream ends
                await self.end(request, turn, response)
        except GatewayError as exc:
            return await self.stream_failed(response, turn, exc)
        return response

    async def stream_failed(self, response: web.StreamResponse | None, turn: Turn, error: GatewayError) -> web.StreamResponse:
        """`error` before the client's stream started goes up to the error middleware; after,
        the answer is incomplete (not recorded) and the stream ends with the format's error event."""
        if response is None or not response.prepared:
            raise error
        self.recorder.failed_in_stream(turn, error)
        await end_stream(response, self.peer.error_event(error))
        return response

    def _learn_payload(self, turn: Turn, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(data, dict):
            self.peer.learn(turn, data)


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
