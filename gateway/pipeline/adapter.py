"""What a wire format gives the one request path (docs/architecture.md, "Wire formats").

``Pipeline`` (``gateway/pipeline/pipeline.py``) is one class; each format hands it a *peer*
(``gateway/<format>/peer.py``, a ``FormatPeer``) through its constructor. The peer parses,
writes the upstream body, reads a complete answer and a relayed stream (``StreamWatch``), tells
a started stream's error event, and names the format's cache fork of a view, its request form
and its chat-only translation. For the recall loop (``gateway/pipeline/recall_loop.py``) it also
reads each upstream answer of a turn into a ``Reply`` and merges the turn's answers into the one
the client sees, in JSON (``JsonTurn``) and in streams (``RecallStream``, built on the one stream
state machine, ``stream_filter.StreamFilter``, over the format's event shapes). Neither the
pipeline nor the loop knows a format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web


@dataclass(slots=True)
class Reply:
    """One upstream answer of a turn, read by its format."""

    recall: list[dict]  # its recall calls, as neutral tool calls
    client: bool  # it also calls a tool of the client's
    complete: bool  # it ended as a round of calls ends (its calls are whole)
    assistant: dict  # the neutral assistant item a recall round appends to the view
    usage: dict | None  # this call's usage, chat-shaped (what the recorder and metrics read)


class JsonTurn(Protocol):
    """The non-streamed answers of one turn, merged into the client's one."""

    def read(self, data: dict) -> Reply | None:
        """One answer (its usage and id taken); None when it cannot be read: it goes to the
        client as it came."""

    def recalled(self, reply: Reply) -> None:
        """`reply` was a recall round: what of it the client still sees is kept."""

    def final(self, data: dict) -> tuple[dict, dict | None, dict | None]:
        """(the client's answer, the neutral item to record or None, the turn's chat usage)."""


class RecallStream(Protocol):
    """The streams of one turn's upstream calls as one stream for the client."""

    def feed(self, event: dict) -> bytes:
        """Bytes for the client for one event (b"" when nothing is told); the provider's error
        event raises it as an ``UpstreamErrorEvent``."""

    def done(self) -> None:
        """The stream's ``[DONE]`` sentinel."""

    def round_end(self) -> Reply | None:
        """The round's answer once its stream ended; None when it was cut short."""

    def end_round(self, *, final: bool) -> bytes:
        """What the round still owes the client: nothing after a recall round."""

    def new_round(self) -> None: ...

    def finish(self) -> bytes:
        """The client's closing events (summed usage, the first call's id)."""

    def answer(self) -> dict | None:
        """The neutral item of what the client was sent, to record (None: nothing complete)."""

    def usage(self) -> dict | None:
        """The turn's usage, chat-shaped."""


class RecallAdapter(Protocol):
    """What the recall loop asks of the pipeline that serves the turn."""

    def call(self, request: web.Request, turn, body: bytes) -> Any:
        """An async context manager: one upstream call, yielding (the response, its reader)."""

    async def record(self, turn, tenant: str | None = None) -> None: ...

    async def answer(self, request: web.Request, turn, response: web.Response, *, record: bool = True) -> web.Response: ...

    async def end(self, request: web.Request, turn, response: web.StreamResponse) -> None: ...

    async def stream_failed(self, response: web.StreamResponse | None, turn, error) -> web.StreamResponse: ...


class StreamWatch:
    """Reads a relayed stream's events on the side: ``feed`` each one (it may raise the
    provider's error event as a GatewayError); ``final`` is the complete answer once the stream
    says it is complete, else None."""

    final: dict | None = None

    def feed(self, event: dict) -> None:
        raise NotImplementedError

    def done(self) -> None:
        """The stream's ``data: [DONE]`` sentinel (Chat Completions ends its streams with it)."""


class FormatPeer:
    """A format's half of the request path, handed to ``Pipeline``; what most formats share is
    written here once."""

    route = ""  # the API's name in metrics, logs and receipts: chat, responses, messages
    path = ""  # its upstream path
    credentials: tuple[str, ...] = ("Authorization", "api-key")  # the client's credential headers
    tool_keys = ("tools", "tool_choice")  # what a recall round's body drops with the recall tools
    through_chat: Any = None  # its translation for a model with api = "chat" (a chat_transport.ChatTransport)
    fork_headers: tuple[str, ...] = ()  # request headers its cache fork repeats

    def parse(self, raw: bytes):
        """The neutral request of a body; 400 in the format's envelope on what cannot be routed."""
        raise NotImplementedError

    def request_form(self, chat) -> dict:
        """What of the request the ledger does not hold (``request_form.skeleton``), for replay."""
        raise NotImplementedError

    def render_body(self, chat, messages: list[dict], tools: list[dict] | None) -> dict:
        """The upstream body for a view whose messages changed."""
        raise NotImplementedError

    def upstream_path(self, request: web.Request) -> str:
        return self.path

    def recalls(self, turn) -> bool:
        """Whether the recall loop serves this turn (its view carries the recall tools)."""
        return turn.view.recall_names is not None

    def body(self, turn) -> bytes:
        """The plain relay's upstream body: the client's bytes when the view is unchanged."""
        view = turn.view
        return turn.chat.raw if view.messages is None else orjson.dumps(self.render_body(turn.chat, view.messages, view.tools))

    def sent(self, turn) -> dict:
        """The body the upstream got first for the turn (the client's own when the view is unchanged)."""
        view, chat = turn.view, turn.chat
        tools = chat.body.get("tools") if turn.recall_refused else view.tools
        return chat.body if view.messages is None else self.render_body(chat, view.messages, tools)

    def recall_body(self, turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        """A recall round's upstream body: `messages` with the recall tools, or with the
        client's own tools only (none, and no tool choice, when the client sent none)."""
        tools = turn.view.tools if with_recall else turn.chat.body.get("tools")
        body = self.render_body(turn.chat, messages, tools)
        if not with_recall and not turn.chat.body.get("tools"):
            for key in self.tool_keys:
                body.pop(key, None)
        return orjson.dumps(body)

    def json_turn(self, turn) -> JsonTurn:
        """The non-streamed answers of a recall turn, merged (its recall.py)."""
        raise NotImplementedError

    def recall_stream(self, turn) -> RecallStream:
        """The streams of a recall turn as one (its recall.py)."""
        raise NotImplementedError

    def learn(self, turn, data: dict) -> None:
        """Take the answer (and usage) to record from a complete answer object."""
        raise NotImplementedError

    def watch(self) -> StreamWatch:
        raise NotImplementedError

    def error_event(self, error) -> bytes:
        """`error` as the last event of a started stream (b"": nothing more to tell)."""
        raise NotImplementedError

    def fork(self, turn, answer: dict):
        """The format's cache fork of the turn's view for its summary call (``pipeline/fork.py``),
        or None where it has none."""
        return None

    def wire_count(self, turn, views) -> int | None:
        """The prompt tokens of the turn's first upstream body as this format's adapter reads it
        back, when that differs from counting the neutral view (the receipt itemises it)."""
        return None

    async def recorded(self, turn, tenant: str | None) -> None:
        """After the answer is recorded: what the format keeps beside the ledger."""
