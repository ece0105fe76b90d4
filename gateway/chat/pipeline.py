"""POST /v1/chat/completions: the per-request pipeline (docs/architecture.md, "A request's path").

1. parse and validate; identify tenant and session,
2. build the view the upstream receives (projection, compaction, recall tools, tailoring): a
   request refused here (400 context_length_exceeded, a storage quota) leaves nothing stored,
3. sync the messages into the ledger (durable before the upstream call; a big sync in a worker
   thread, so the event loop keeps serving),
6. forward; resolve recall calls (``RecallLoop``); stream the answer to the client as it comes,
7. record the answer, update metrics, let the summariser know (``TurnRecorder``).

When the view equals what the client sent, the client's body bytes are forwarded unchanged.
Big bodies are parsed, hashed and projected off the event loop (``gateway.pipeline.offload``).
A failure after the client's stream started ends that stream with an error event; the answer
is then incomplete and is not recorded.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from gateway.chat.adapter import parse_and_hash
from gateway.chat.fork import summary_fork
from gateway.pipeline import offload
from gateway.pipeline.pipeline import sync_history
from gateway.pipeline.quota import StorageQuota
from gateway.pipeline.recall_loop import RecallLoop, body_without_recall
from gateway.pipeline.turn import Timing, Turn, TurnRecorder, clean_usage
from gateway.pipeline.views import View, ViewBuilder
from gateway.http.errors import GatewayError, UpstreamIncomplete
from gateway.http.identity import Identity
from gateway.http.sse import SSEDecoder, StreamAssembler, end_with_error
from gateway.http.upstream import Upstream, response_headers
from gateway.keys import LOG_FIELDS, MODEL, PIPELINE, REQUEST_ID, SESSION, TENANT, UPSTREAM_KEY
from store import call as store_call

class ChatPipeline:
    def __init__(self, *, settings, upstream: Upstream, ledger, identity: Identity, metrics, views: ViewBuilder,
                 recall: RecallLoop, recorder: TurnRecorder, quota: StorageQuota | None = None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.ledger = ledger
        self.identity = identity
        self.metrics = metrics
        self.views = views
        self.recall = recall
        self.recorder = recorder
        self.quota = quota
        self._drop = frozenset({settings.session.header.lower()})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing = Timing()
        tenant = self.identity.tenant(request)  # 401 here for a missing/unknown client key
        chat, ids = await offload.parse_and_hash(await request.read(), parse_and_hash)
        model_label = self.metrics.model_label(chat.model)
        request[MODEL] = model_label
        # The fingerprint fallback (when enabled) names the session by its first event.
        ref = self.identity.session(request, tenant, ids[0] if ids else None)
        request[TENANT] = tenant
        if ref is not None:
            request[SESSION] = ref.key
            chat.ids = ids
            if self.quota is not None:
                await self.quota.check(tenant)  # 429 before anything is stored
        # The client's credential (Authorization, or Azure-style api-key) for summary and discovery calls.
        auth = {h: v for h in ("Authorization", "api-key") if (v := request.headers.get(h))} or None
        view = await offload.build_view(self.views, chat, ref, auth) if ref is not None else View()
        if ref is not None and ids:
            await self._sync(ref, chat, ids)
        turn = Turn(chat, ref, model_label, timing, view, auth=auth, fork=summary_fork)
        turn.headers["x-request-id"] = request.get(REQUEST_ID, "")
        if ref is not None:
            turn.headers["x-palimpsest-session"] = ref.session_id
            turn.headers["x-palimpsest-prompt-tokens-client"] = str(view.client_tokens)
            turn.headers["x-palimpsest-prompt-tokens-upstream"] = str(view.upstream_tokens)
            if view.checkpoint:
                turn.headers["x-palimpsest-checkpoint"] = view.checkpoint
            if view.truncated_tool_results:
                turn.headers["x-palimpsest-truncated-tool-results"] = str(view.truncated_tool_results)
            if view.truncated_last_message:
                turn.headers["x-palimpsest-truncated-last-message"] = "true"
        try:
            if view.recall_names is not None and not _many_choices(chat.body):
                response = await self.recall.respond(request, turn)
            elif chat.stream:
                response = await self._relay_stream(request, turn)
            else:
                response = await self._relay_json(request, turn)
            if turn.failure is None:
                turn.status = response.status
            return response
        except GatewayError as exc:
            turn.status = exc.status  # rendered (and counted by kind) by the error middleware
            raise
        finally:
            self.recorder.observe(turn)
            request[LOG_FIELDS] = {
                "tokens_client": view.client_tokens, "tokens_upstream": view.upstream_tokens,
                "upstream_ms": round(timing.upstream * 1000, 2), "recall_calls": turn.recall_calls,
            }
            if turn.failure is not None:  # the status line said 200; the stream ended with this error
                request[LOG_FIELDS]["stream_error"] = turn.failure.code

    async def _sync(self, ref, chat, ids: list[str]) -> None:
        await sync_history(self.ledger, self.metrics, self.quota, ref, chat, ids)

    # -- forwarding ------------------------------------------------------------------------

    def _body(self, turn: Turn) -> bytes:
        if turn.view.recall_names is not None:
            # n > 1: the recall loop would have to resolve each choice's calls apart; the view
            # goes without recall tools instead, and the choices stay the model's own.
            return body_without_recall(turn, list(turn.view.messages or ()))
        return turn.view.body(turn.chat)

    async def _relay_json(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        t0 = time.perf_counter()
        async with self.upstream.post_chat(request.headers, self._body(turn), drop=self._drop, tenant_key=request.get(UPSTREAM_KEY, "")) as up:
            payload = await self.upstream.reader(up).read()
            turn.timing.waiting(t0)
            headers = response_headers(up.headers, decoded=True)
            headers.update(turn.headers)
            if up.status == 200:
                _learn(turn, payload)
                self.recorder.bill(turn)
                if turn.billed is not None:  # known before the body goes out: JSON answers only
                    headers["x-palimpsest-cached-tokens"] = str(turn.billed.cached)
            else:
                self.metrics.upstream_error(up.status)
            response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
        await self.recorder.answer(turn)  # durable before the client has it (~0.1 ms embedded)
        await response.prepare(request)
        await response.write_eof()
        return response

    async def _relay_stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        t0 = time.perf_counter()
        response: web.StreamResponse | None = None
        try:
            async with self.upstream.post_chat(request.headers, self._body(turn), drop=self._drop, tenant_key=request.get(UPSTREAM_KEY, "")) as up:
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
                        _learn(turn, payload)  # a provider that ignored stream=true
                    response = web.Response(status=up.status, reason=up.reason, body=payload, headers=headers)
                    await self.recorder.answer(turn)  # durable before the client has it
                    await response.prepare(request)
                    await response.write_eof()
                    return response
                response = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
                await response.prepare(request)
                assembler = await self._pump(reader, response, turn)
                if assembler.finish_reason is None and not assembler.done:
                    raise UpstreamIncomplete("The upstream's stream ended before the answer was complete.")
                message = assembler.message()
                # [DONE] without a finish_reason (some servers never name one) still ends a
                # complete answer; an empty one is not worth an event.
                if assembler.finish_reason is not None or message.get("content") or len(message) > 2:
                    turn.answer = message
                    turn.usage = clean_usage(assembler.usage)
                await self.recorder.answer(turn)  # durable before the response ends
                await response.write_eof()
        except GatewayError as exc:
            if response is None or not response.prepared:
                raise
            self.recorder.failed_in_stream(turn, exc)
            await end_with_error(response, exc)
            return response
        return response

    async def _pump(self, reader, response: web.StreamResponse, turn: Turn) -> StreamAssembler:
        """Relay the upstream's bytes as they come, and rebuild the answer on the side."""
        decoder, assembler = SSEDecoder(), StreamAssembler()
        while True:
            t0 = time.perf_counter()
            chunk = await reader.chunk()
            turn.timing.waiting(t0)
            if not chunk:
                return assembler
            await response.write(chunk)
            for data in decoder.feed(chunk):
                if data == "[DONE]":
                    assembler.done = True
                    continue
                try:
                    assembler.add(orjson.loads(data))
                except (orjson.JSONDecodeError, AttributeError, TypeError):
                    continue


def _many_choices(body: dict) -> bool:
    n = body.get("n")
    return isinstance(n, int) and not isinstance(n, bool) and n > 1


def _learn(turn: Turn, payload: bytes) -> None:
    """The answer of a complete non-streamed completion (choice 0), and its usage."""
    try:
        data = orjson.loads(payload)
        choice = data["choices"][0]
        turn.usage = clean_usage(data.get("usage"))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return
    if isinstance(choice, dict) and choice.get("finish_reason") and isinstance(choice.get("message"), dict):
        turn.answer = choice["message"]


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PIPELINE].handle(request)
