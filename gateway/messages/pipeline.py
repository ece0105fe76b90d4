"""POST /v1/messages (and /v1/messages/count_tokens): the per-request pipeline for Anthropic Messages.

The same steps as chat completions (docs/architecture.md, "A request's path"), on the neutral
model the Messages adapter parses (``gateway/formats/messages.py``):

1. identify tenant (``x-api-key`` is a credential too) and session (``X-Session-Id``, else
   Claude Code's ``X-Claude-Code-Session-Id``),
2. sync the conversation into the ledger (durable before the upstream call),
3. build the view (shared ``ViewBuilder``: projection, compaction, recall tools, tailoring),
4. forward (the client's bytes when the view is unchanged, else the rendered view with the
   gateway's cache breakpoints); resolve recall calls in the loop (``gateway/messages/loop.py``),
5. record the answer (the blocks the client saw).

Errors the gateway itself answers on these routes use Anthropic's envelope
(``gateway/http/middleware.py``); the upstream's own errors (a 529 ``overloaded_error``) are
relayed as it sent them. ``count_tokens`` answers the gateway's estimate of the view it would
send, without calling the upstream, writing the ledger or starting a summary.
"""

from __future__ import annotations

import contextlib
import copy
import time

import orjson
from aiohttp import web

from gateway.chat import offload
from gateway.chat.turn import Timing, Turn, TurnRecorder
from gateway.chat.views import View, ViewBuilder
from gateway.formats import messages as fmt
from gateway.http.errors import GatewayError, UpstreamIncomplete, UpstreamErrorEvent, anthropic_error_type
from gateway.http.identity import Identity
from gateway.http.sse import SSEDecoder
from gateway.http.upstream import Upstream, response_headers
from gateway.keys import LOG_FIELDS, MODEL, REQUEST_ID, SESSION, TENANT, UPSTREAM_KEY
from gateway.messages.stream import MessageAssembler, chat_usage, encode, visible_blocks
from gateway.ops.readonly import NoMetrics, NoSummaries
from store import call as store_call
from store.canonical import path_ids

ROUTE = "messages"
PATH = "/v1/messages"
CREDENTIALS = ("Authorization", "api-key", "x-api-key")


def parse_and_hash(raw: bytes):
    chat = fmt.parse_messages_request(raw)
    return chat, path_ids(chat.history) if chat.history else []


async def parsed(raw: bytes):
    if not offload.is_big(raw):
        return parse_and_hash(raw)
    import asyncio

    return await asyncio.to_thread(parse_and_hash, raw)


def upstream_path(request: web.Request) -> str:
    """The upstream path with the client's query (Claude Code sends ``?beta=true``)."""
    return PATH + (f"?{request.query_string}" if request.query_string else "")


def answer_of(message: dict, names: tuple[str, str] | None = None) -> dict | None:
    """The neutral assistant item of what the client got (None for an incomplete answer)."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list) or not message.get("stop_reason"):
        return None
    blocks = visible_blocks(message["content"], names)
    return fmt.assistant_item(blocks) if blocks else None


class MessagesPipeline:
    def __init__(self, *, settings, upstream: Upstream, ledger, identity: Identity, metrics, views: ViewBuilder,
                 recorder: TurnRecorder, loop=None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.identity = identity
        self.metrics = metrics
        self.views = views
        self.recorder = recorder
        self.loop = loop  # MessagesRecallLoop, set by the composition root
        self._drop = frozenset({settings.session.header.lower()})
        # A view builder that cannot start summary jobs or move counters (count_tokens).
        self._estimates = copy.copy(views)
        self._estimates.summarizer = NoSummaries()
        self._estimates.metrics = NoMetrics()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing = Timing()
        tenant = self.identity.tenant(request)
        raw = await request.read()
        chat, ids = await parsed(raw)
        request[MODEL] = model_label = self.metrics.model_label(chat.model)
        request[TENANT] = tenant
        ref = self.identity.session(request, tenant, ids[0] if ids else None)
        if ref is not None and ids:
            synced = await store_call(self.ledger.sync, ref, chat.history, ids, chat.model)
            chat.ids = synced.ids
            if synced.added:
                self.metrics.ledger_events.labels("message").inc(synced.added)
            request[SESSION] = ref.key
        auth = {h: v for h in CREDENTIALS if (v := request.headers.get(h))} or None
        view = await offload.build_view(self.views, chat, ref, auth) if ref is not None and ids else View()
        turn = Turn(chat, ref, model_label, timing, view, auth=auth, route=ROUTE)
        turn.headers["x-request-id"] = request.get(REQUEST_ID, "")
        if ref is not None:
            turn.headers["x-palimpsest-session"] = ref.session_id
            turn.headers["x-palimpsest-prompt-tokens-client"] = str(view.client_tokens)
            turn.headers["x-palimpsest-prompt-tokens-upstream"] = str(view.upstream_tokens)
            if view.checkpoint:
                turn.headers["x-palimpsest-checkpoint"] = view.checkpoint
        try:
            if view.recall_names is not None:
                response = await self.loop.respond(request, turn)
            else:
                response = await self._relay(request, turn)
            if turn.failure is None:
                turn.status = response.status
            return response
        except GatewayError as exc:
            turn.status = exc.status
            raise
        finally:
            self.recorder.observe(turn)
            request[LOG_FIELDS] = {"tokens_client": view.client_tokens, "tokens_upstream": view.upstream_tokens,
                                   "upstream_ms": round(timing.upstream * 1000, 2), "recall_calls": turn.recall_calls}

    async def count_tokens(self, request: web.Request) -> web.Response:
        """``{"input_tokens": N}`` for the view the gateway would send for this body."""
        tenant = self.identity.tenant(request)
        chat, ids = await parsed(await request.read())
        ref = self.identity.session(request, tenant, ids[0] if ids else None)
        chat.ids = ids
        if ref is None or not ids:
            # Without a session the gateway forwards the request as it came: its own size.
            counter = self.views.counter
            raw_tokens = counter.count_messages(chat.instructions + chat.history) + counter.count_tools(chat.body.get("tools"))
            tokens = self.views.calibration.scale(chat.model, raw_tokens)
        else:
            auth = {h: v for h in CREDENTIALS if (v := request.headers.get(h))} or None
            tokens = (await self._estimates.build(chat, ref, auth)).upstream_tokens
        return web.json_response({"input_tokens": tokens})

    # -- forwarding --------------------------------------------------------------------------

    def body(self, turn: Turn) -> bytes:
        if turn.view.messages is None:
            return turn.chat.raw
        return orjson.dumps(fmt.render_body(turn.chat, turn.view.messages, turn.view.tools))

    async def _relay(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        t0 = time.perf_counter()
        response: web.StreamResponse | None = None
        try:
            async with self.upstream.post(upstream_path(request), request.headers, self.body(turn), drop=self._drop,
                                          tenant_key=request.get(UPSTREAM_KEY, "")) as up:
                turn.timing.waiting(t0)
                reader = self.upstream.reader(up)
                headers = response_headers(up.headers, decoded=True)
                headers.update(turn.headers)
                if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                    if up.status != 200:
                        self.metrics.upstream_error(up.status)
                    t0 = time.perf_counter()
                    payload = await reader.read()
                    turn.timing.waiting(t0)
                    if up.status == 200:
                        self._learn(turn, payload)
                    response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
                    await self.recorder.answer(turn)
                    await response.prepare(request)
                    await response.write_eof()
                    return response
                response = web.StreamResponse(status=200, reason=up.reason, headers=headers)
                await response.prepare(request)
                assembler = await self._pump(reader, response, turn)
                if not assembler.stopped:
                    raise UpstreamIncomplete("The upstream's stream ended before the message was complete.")
                self._learn_message(turn, assembler.whole())
                await self.recorder.answer(turn)
                await response.write_eof()
        except GatewayError as exc:
            if response is None or not response.prepared:
                raise
            self.recorder.failed_in_stream(turn, exc)
            await end_stream_with_error(response, exc)
        return response

    async def _pump(self, reader, response: web.StreamResponse, turn: Turn) -> MessageAssembler:
        """Relay the upstream's bytes as they come; the message rebuilt on the side."""
        decoder, assembler = SSEDecoder(), MessageAssembler()
        while True:
            t0 = time.perf_counter()
            chunk = await reader.chunk()
            turn.timing.waiting(t0)
            if not chunk:
                return assembler
            await response.write(chunk)
            for data in decoder.feed(chunk):
                try:
                    event = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    if event.get("type") == "error":
                        raise _told(event)
                    assembler.add(event)

    def _learn(self, turn: Turn, payload: bytes) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        self._learn_message(turn, data)

    def _learn_message(self, turn: Turn, data) -> None:
        if not isinstance(data, dict):
            return
        turn.usage = chat_usage(data.get("usage"))
        turn.answer = answer_of(data, turn.view.recall_names)


class _Relayed(UpstreamErrorEvent):
    """An error event the plain relay already passed on to the client: nothing more to tell."""


def _told(event: dict) -> UpstreamErrorEvent:
    error = _Relayed(event.get("error") if isinstance(event.get("error"), dict) else {})
    return error


async def end_stream_with_error(response: web.StreamResponse, error: GatewayError) -> None:
    """A started Messages stream ends with Anthropic's ``error`` event (the SDK raises it) and
    the connection closes: no ``message_stop`` follows, so the client never takes it for one."""
    response.force_close()
    with contextlib.suppress(ConnectionError, RuntimeError):
        if not isinstance(error, _Relayed):
            await response.write(encode({"type": "error", "error": {
                "type": error.type if isinstance(error, UpstreamErrorEvent) else anthropic_error_type(error.status),
                "message": error.message}}))
        await response.write_eof()
