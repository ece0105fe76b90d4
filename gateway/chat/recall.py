"""Chat Completions for the recall loop (``gateway/pipeline/recall_loop.py``): bodies with and
without the recall tools, each answer read into a ``Reply``, and the turn's answers merged into
the client's one, in JSON and in streams.

In a stream, content deltas pass through as they come, recall tool-call deltas never do, tool
call indices are renumbered for the client, every chunk carries the first call's id, and the
finish reason and usage (summed over the turn's calls) are told once, at the end. A stream that
ends with [DONE] but no finish_reason ends the client's the same way, without one. In JSON a
recall round's text is kept and goes before the final answer's, as a stream shows it. An answer
cut off (``length``, ``content_filter``) is never a recall round.

The loop answers requests for one choice; with ``n > 1`` the pipeline forwards the view
without recall tools (``body_without_recall``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.http.errors import UpstreamErrorEvent
from gateway.http.sse import StreamAssembler, ToolCallIndexer, encode_event, readable_chunk, readable_completion
from gateway.pipeline.adapter import Reply
from gateway.pipeline.stream_filter import Role, StreamFilter
from gateway.pipeline.turn import Turn, add_usage
from policies import is_recall_call

RECALL_CHOICE_KEYS = ("tool_choice", "parallel_tool_calls")


def _without_recall(turn: Turn, messages: list[dict]) -> dict:
    body = dict(turn.chat.body)
    body["messages"] = messages
    client_tools = turn.chat.body.get("tools")
    if client_tools:
        body["tools"] = client_tools
    else:
        body.pop("tools", None)
        for key in RECALL_CHOICE_KEYS:
            body.pop(key, None)
    return body


def body_without_recall(turn: Turn, messages: list[dict]) -> bytes:
    """The request body with `messages` and the client's own tools only."""
    return orjson.dumps(_without_recall(turn, messages))


def recall_body(turn: Turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
    if with_recall:
        body = dict(turn.chat.body)
        body["messages"] = messages
        body["tools"] = turn.view.tools
    else:
        body = _without_recall(turn, messages)
    if stream:
        # Usage of every call is needed to report the turn's total; the client's own
        # stream_options decide whether it is shown.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body)


# Finish reasons of an answer that was cut off: its last call's arguments may be cut too, so
# its recall calls are not run (the client gets the answer without them).
CUT = ("length", "content_filter")


def _complete(finish_reason: Any) -> bool:
    return finish_reason is not None and finish_reason not in CUT


def _reply(message: dict, names: tuple[str, str], usage: Any, complete: bool) -> Reply:
    calls = message.get("tool_calls") or []
    recall = [c for c in calls if is_recall_call(c, names)]
    return Reply(recall=recall, client=len(recall) < len(calls), complete=complete,
                 assistant={"role": "assistant", "content": message.get("content"), "tool_calls": recall},
                 usage=usage)


class ChatJsonTurn:
    """The non-streamed completions of one turn: usage summed, recall calls dropped."""

    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.usage: dict | None = None
        self.shown = ""  # what recall rounds said (their text), before the final answer's

    def read(self, data: dict) -> Reply | None:
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            return None
        if not readable_completion(data):
            return None
        self.usage = add_usage(self.usage, data.get("usage"))
        self._content = message.get("content")
        return _reply(message, self.names, data.get("usage"), complete=_complete(data["choices"][0].get("finish_reason")))

    def recalled(self, reply: Reply) -> None:
        if isinstance(self._content, str):  # a recall round's text: the client sees it, as a stream shows it
            self.shown += self._content

    def final(self, data: dict) -> tuple[dict, dict | None, dict | None]:
        for choice in data.get("choices") or ():
            msg = choice.get("message") or {}
            calls = msg.get("tool_calls")
            if calls:
                kept = [c for c in calls if not is_recall_call(c, self.names)]
                if kept:
                    msg["tool_calls"] = kept
                else:
                    msg.pop("tool_calls", None)
                    if choice.get("finish_reason") == "tool_calls":
                        choice["finish_reason"] = "stop"
        if self.shown:
            msg = data["choices"][0].get("message") or {}
            msg["content"] = self.shown + (msg.get("content") if isinstance(msg.get("content"), str) else "")
        if self.usage is not None:
            data["usage"] = self.usage
        answer = data["choices"][0]["message"] if data["choices"][0].get("finish_reason") else None
        return data, answer, self.usage


@dataclass(slots=True)
class _Sent:
    """What the client has been sent so far in one streamed turn (across upstream calls)."""

    first: dict[str, Any] = field(default_factory=dict)  # id, created, model of the first chunk
    client_calls: dict[int, dict] = field(default_factory=dict)
    content_parts: list[str] = field(default_factory=list)
    answer: StreamAssembler = field(default_factory=StreamAssembler)  # what the client was sent, as a message


class ChatRecallStream:
    """The chat streams of one turn as the client's one stream (see the module docstring). Its
    tool calls are the items of the one stream state machine (``StreamFilter``): a chunk carries
    deltas of several at once, so each delta is routed through it here."""

    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.want_usage = bool((turn.chat.body.get("stream_options") or {}).get("include_usage"))
        self.sent = _Sent()
        self.filter = StreamFilter(None, add_usage)
        self._round()

    def _round(self) -> None:
        self.assembler, self.indexer = StreamAssembler(), ToolCallIndexer()
        self.finish_reason: str | None = None
        self.call_usage: dict | None = None

    def new_round(self) -> None:
        self.filter.new_round()
        self._round()

    def done(self) -> None:
        self.assembler.done = True

    def feed(self, event: dict) -> bytes:
        if not readable_chunk(event):
            return b""  # what the gateway cannot read it cannot rewrite: left out, the stream goes on
        if isinstance(event.get("error"), dict) and not event.get("choices"):
            raise UpstreamErrorEvent(event["error"])  # told to the client as the provider said it
        if not self.sent.first:
            self.sent.first = {k: event.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        self.indexer.number(event)  # tool-call deltas without an index get one: the assembler's and the client's
        self.assembler.add(event)
        if event.get("usage"):
            self.call_usage = event["usage"]
        forwarded = self._filter(event)
        for choice in event.get("choices") or ():
            if choice.get("index", 0) == 0 and choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return encode_event(forwarded) if forwarded is not None else b""

    def round_end(self) -> Reply | None:
        if self.finish_reason is None and not self.assembler.done:
            return None
        return _reply(self.assembler.message(), self.names, self.call_usage, complete=_complete(self.finish_reason))

    def end_round(self, *, final: bool) -> bytes:
        return self.filter.end_round(self.call_usage, {}, final=final)  # chat holds nothing back

    def answer(self) -> dict | None:
        sent = self.sent
        answer = sent.answer.message()  # content, refusal, a legacy function_call: as the client got them
        answer.pop("tool_calls", None)
        answer["content"] = "".join(sent.content_parts) or None
        if sent.client_calls:
            answer["tool_calls"] = [sent.client_calls[i] for i in sorted(sent.client_calls)]
        if self.finish_reason is not None or answer.get("content") or len(answer) > 2:  # [DONE] alone: only an answer with something in it
            return answer
        return None

    def usage(self) -> dict | None:
        return self.filter.usage

    def finish(self) -> bytes:
        first, finish = self.sent.first, self.finish_reason
        if finish == "tool_calls" and not self.sent.client_calls:
            finish = "stop"
        # A provider that ended with [DONE] but named no finish_reason gets none invented.
        tail = bytearray(encode_event({**first, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
                         if finish is not None else b"")
        if self.want_usage and self.filter.usage is not None:
            tail += encode_event({**first, "object": "chat.completion.chunk", "choices": [], "usage": self.filter.usage})
        tail += encode_event("[DONE]")
        return bytes(tail)

    def _filter(self, event: dict) -> dict | None:
        """The client's view of one upstream chunk: one id, no recall tool calls, no finish or
        usage (those are sent once, at the end of the turn). Everything else a delta carries
        (a legacy function_call, a refusal, reasoning text, audio) reaches the client."""
        sent, names, items = self.sent, self.names, self.filter
        first, client_calls, content_parts = sent.first, sent.client_calls, sent.content_parts
        choices_out = []
        for choice in event.get("choices") or ():
            delta = dict(choice.get("delta") or {})
            calls = delta.pop("tool_calls", None) or []
            kept_calls = []
            for call in calls:
                idx = call.get("index", 0)
                name = ((call.get("function") or {}).get("name")) or ""
                if items.hidden(idx):
                    continue
                if items.place(idx) is None:  # its first delta: a recall call by its name, else the client's
                    items.open(idx, Role.HIDDEN if name and name in names else Role.SHOWN)
                    if items.hidden(idx):
                        continue
                client = items.place(idx)
                mapped = {**call, "index": client}
                kept_calls.append(mapped)
                slot = client_calls.setdefault(client, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
                slot.update((k, v) for k, v in call.items() if k not in ("index", "id", "type", "function") and v is not None)
            if kept_calls:
                delta["tool_calls"] = kept_calls
            if delta.get("content"):
                content_parts.append(delta["content"])
            if choice.get("index", 0) == 0:
                sent.answer.add({"choices": [{"delta": {k: v for k, v in delta.items() if k not in ("content", "tool_calls")}}]})
            others = any(v for k, v in delta.items() if k not in ("role", "content", "tool_calls"))
            has_payload = bool(delta.get("content") or kept_calls or others or (delta.get("role") and not content_parts and not client_calls))
            if has_payload:
                choices_out.append({**choice, "delta": delta, "finish_reason": None})
        if not choices_out:
            return None
        return {**event, **first, "choices": choices_out, "usage": None} if "usage" in event else {**event, **first, "choices": choices_out}
