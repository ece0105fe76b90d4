"""POST /v1/messages (and /v1/messages/count_tokens): the per-request pipeline for Anthropic Messages.

The same steps as chat completions (docs/architecture.md, "A request's path"), on the neutral
model the Messages adapter parses (``gateway/messages/adapter.py``):

1. identify tenant (``x-api-key`` is a credential too) and session (``X-Session-Id``, else
   Claude Code's ``X-Claude-Code-Session-Id``),
2. sync the conversation into the ledger (durable before the upstream call),
3. build the view (shared ``ViewBuilder``: projection, compaction, recall tools, tailoring),
4. forward (the client's bytes when the view is unchanged, else the rendered view with the
   gateway's cache breakpoints), to the upstream of the model, through Chat Completions for a
   model configured with ``api = "chat"`` (``gateway/messages/chat_upstream.py``); resolve
   recall calls in the shared loop (``gateway/messages/recall.py`` reads its answers),
5. record the answer (the blocks the client saw).

Errors the gateway itself answers on these routes use Anthropic's envelope
(``gateway/http/middleware.py``); the upstream's own errors (a 529 ``overloaded_error``) are
relayed as it sent them. ``count_tokens`` answers the gateway's estimate of the view it would
send, without calling the upstream, writing the ledger or starting a summary. The shared steps
are ``WirePipeline``'s (``gateway/pipeline/pipeline.py``).
"""

from __future__ import annotations

import contextlib

import orjson
from aiohttp import web

from gateway.messages.request_form import skeleton
from gateway.pipeline.turn import Turn
from gateway.messages import adapter as fmt
from gateway.messages.chat_upstream import MessagesChatUpstream
from gateway.pipeline.pipeline import StreamWatch, WirePipeline
from gateway.http.errors import GatewayError, UpstreamErrorEvent, anthropic_error_type
from gateway.messages.fork import FORMAT_HEADERS, summary_fork as messages_fork
from gateway.http.gate import tenant_of
from gateway.messages.recall import RECALL
from gateway.messages.stream import MessageAssembler, answer_of, chat_usage, encode
from gateway.pipeline.history_ids import history_ids

ROUTE = "messages"
PATH = "/v1/messages"
CREDENTIALS = ("Authorization", "api-key", "x-api-key")


def parse_and_hash(raw: bytes):
    chat = fmt.parse_messages_request(raw)
    return chat, history_ids(chat.history, len(raw))


def upstream_path(request: web.Request) -> str:
    """The upstream path with the client's query (Claude Code sends ``?beta=true``)."""
    return PATH + (f"?{request.query_string}" if request.query_string else "")


class MessagesWatch(StreamWatch):
    """A relayed Messages stream: the message rebuilt from its events, whole once it stopped;
    the provider's error event (already relayed) ends the stream without another."""

    def __init__(self) -> None:
        self.assembler = MessageAssembler()

    def feed(self, event: dict) -> None:
        if event.get("type") == "error":
            raise _told(event)
        self.assembler.add(event)
        if self.assembler.stopped:
            self.final = self.assembler.whole()


class MessagesPipeline(WirePipeline):
    route = ROUTE
    path = PATH
    credentials = CREDENTIALS
    through_chat = MessagesChatUpstream  # a model configured with api = "chat" (Claude Code on any model)
    recall_format = RECALL
    request_form = staticmethod(skeleton)  # kept in the turn log for `palimpsest replay`

    def __init__(self, **parts) -> None:
        super().__init__(**parts)
        # A view builder that cannot start summary jobs or move counters (count_tokens).
        self._estimates = self.views.readonly()

    def parse_and_hash(self, raw: bytes):
        return parse_and_hash(raw)

    def upstream_path(self, request: web.Request) -> str:
        return upstream_path(request)

    def render(self, turn: Turn) -> bytes:
        return orjson.dumps(fmt.render_body(turn.chat, turn.view.messages, turn.view.tools))

    def watch(self) -> StreamWatch:
        return MessagesWatch()

    def forker(self, request: web.Request):
        """The Messages body the upstream received, forked (gateway/messages/fork.py), with the
        request's version and beta headers and its query."""
        headers = {h: v for h in FORMAT_HEADERS if (v := request.headers.get(h))}
        query = request.query_string

        def fork(turn: Turn, answer: dict):
            if self.transport(turn.chat.model) is not self.upstream.for_model(turn.chat.model):
                return None  # the view went as Chat Completions: no Messages prefix is cached
            view = turn.view
            tools = turn.chat.body.get("tools") if turn.recall_refused else view.tools
            parent = turn.chat.body if view.messages is None else fmt.render_body(turn.chat, view.messages, tools)
            return messages_fork(parent, answer, view.upstream_tokens, headers, query)

        return fork

    def wire_count(self, turn: Turn) -> int | None:
        """The first upstream body re-read: its system blocks are one instruction, and consecutive
        user-side items one user message, where the neutral view holds them apart."""
        view = turn.view
        tools = turn.chat.body.get("tools") if turn.recall_refused or view.tools is None else view.tools
        body = fmt.render_body(turn.chat, view.messages, tools)
        sent = fmt.parse_messages_request(orjson.dumps(body))
        counter = self.views.counter
        return counter.count_messages([*sent.instructions, *sent.history]) + self.views.tool_tokens(sent, body.get("tools"))

    async def end_stream(self, response: web.StreamResponse, error: GatewayError) -> None:
        await end_stream_with_error(response, error)

    def learn(self, turn: Turn, data: dict) -> None:
        turn.usage = chat_usage(data.get("usage"))
        turn.answer = answer_of(data, turn.view.recall_names)

    async def count_tokens(self, request: web.Request) -> web.Response:
        """``{"input_tokens": N}`` for the view the gateway would send for this body."""
        tenant = tenant_of(request)  # resolved by the route's gate
        chat, ids = await self.parsed(await request.read())
        ref = self.identity.session(request, tenant, ids[0] if ids else None)
        chat.ids = ids
        if ref is None or not ids:
            # Without a session the gateway forwards the request as it came: its own size.
            counter = self.views.counter
            raw_tokens = counter.count_messages(chat.instructions + chat.history) + counter.count_tools(chat.body.get("tools"))
            tokens = self.views.calibration.scale(chat.model, raw_tokens)
        else:
            tokens = (await self._estimates.build(chat, ref, self.auth(request))).upstream_tokens
        return web.json_response({"input_tokens": tokens})


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
