"""Anthropic Messages' peer on the one request path (``gateway/pipeline/pipeline.py``).

What is Messages' own on ``POST /v1/messages``: parsing and rendering (``messages/adapter.py``,
the gateway's cache breakpoints placed), the client's query on the upstream path (Claude Code
sends ``?beta=true``), ``x-api-key`` as a credential, reading a complete answer and a relayed
stream, Anthropic's ``error`` event for a started stream (the provider's own, already relayed,
is not told twice), the cache fork of a view with the request's version and beta headers
(``messages/fork.py``), the prompt tokens of its wire form for the receipt, the request form
kept for replay and the translation for a chat-only model (``messages/chat_upstream.py``). Its
answers for the recall loop are ``messages/recall.py``'s; ``count_tokens`` is ``count_tokens.py``'s.
Errors the gateway itself answers on these routes use Anthropic's envelope
(``gateway/http/middleware.py``); the upstream's own errors (a 529 ``overloaded_error``) are
relayed as it sent them.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.http.errors import GatewayError, UpstreamErrorEvent, anthropic_error_type
from gateway.messages import adapter as fmt
from gateway.messages.chat_upstream import MessagesChatUpstream
from gateway.messages.fork import FORMAT_HEADERS, summary_fork
from gateway.messages.recall import MessagesJsonTurn, MessagesRecallStream
from gateway.messages.request_form import skeleton
from gateway.messages.stream import MessageAssembler, answer_of, chat_usage, encode
from gateway.pipeline.adapter import FormatPeer, StreamWatch
from gateway.pipeline.turn import Turn


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


class MessagesPeer(FormatPeer):
    route = "messages"
    path = "/v1/messages"
    credentials = ("Authorization", "api-key", "x-api-key")
    through_chat = MessagesChatUpstream  # a model configured with api = "chat" (Claude Code on any model)
    fork_headers = FORMAT_HEADERS
    parse = staticmethod(fmt.parse_messages_request)
    render_body = staticmethod(fmt.render_body)
    request_form = staticmethod(skeleton)  # kept in the turn log for `palimpsest replay`
    watch = MessagesWatch  # a new watch for each relayed stream
    json_turn, recall_stream = MessagesJsonTurn, MessagesRecallStream  # for the recall loop (recall.py)

    def upstream_path(self, request: web.Request) -> str:
        """The upstream path with the client's query (Claude Code sends ``?beta=true``)."""
        return self.path + (f"?{request.query_string}" if request.query_string else "")

    def fork(self, turn: Turn, answer: dict):
        """The Messages body the upstream received, forked (gateway/messages/fork.py), with the
        request's version and beta headers and its query; none for a view that went as Chat
        Completions (no Messages prefix is cached)."""
        if turn.via_chat:
            return None
        return summary_fork(self.sent(turn), answer, turn.view.upstream_tokens, turn.fork_headers or {}, turn.query)

    def wire_count(self, turn: Turn, views) -> int | None:
        """The first upstream body re-read: its system blocks are one instruction, and consecutive
        user-side items one user message, where the neutral view holds them apart."""
        body = self.sent(turn)
        sent = fmt.parse_messages_request(orjson.dumps(body))
        return views.counter.count_messages([*sent.instructions, *sent.history]) + views.tool_tokens(sent, body.get("tools"))

    def learn(self, turn: Turn, data: dict) -> None:
        turn.usage = chat_usage(data.get("usage"))
        turn.answer = answer_of(data, turn.view.recall_names)

    def error_event(self, error: GatewayError) -> bytes:
        """Anthropic's ``error`` event (the SDK raises it); no ``message_stop`` follows."""
        if isinstance(error, _Relayed):
            return b""
        return encode({"type": "error", "error": {
            "type": error.type if isinstance(error, UpstreamErrorEvent) else anthropic_error_type(error.status),
            "message": error.message}})


class _Relayed(UpstreamErrorEvent):
    """An error event the plain relay already passed on to the client: nothing more to tell."""


def _told(event: dict) -> UpstreamErrorEvent:
    return _Relayed(event.get("error") if isinstance(event.get("error"), dict) else {})
