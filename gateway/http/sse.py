"""Server-sent events as the OpenAI API speaks them, and assembly of a streamed answer.

The decoder follows the SSE spec closely enough for OpenAI-compatible servers: events are
separated by a blank line (LF or CRLF), ``data:`` lines of one event are joined with newlines,
comments and other fields are ignored. The assembler rebuilds the assistant message from the
deltas (content, tool calls merged by index) so the gateway can record it in the ledger.

A failure after the client's stream has started cannot change the status any more: it is told
as one last event, ``data: {"error": {...}}`` (the OpenAI envelope, which the openai SDK raises
as ``APIError``), and the connection is closed after it (``end_with_error``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from aiohttp import web

from gateway.http.errors import GatewayError


class SSEDecoder:
    """Incremental: each byte is scanned for an event end once, however the stream is cut
    (an event of many megabytes arriving in 64 KiB chunks stays linear, not quadratic)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already known to hold no event end

    def feed(self, chunk: bytes) -> list[str]:
        """Bytes in, complete events' data out (as text, e.g. '{...}' or '[DONE]')."""
        self._buffer += chunk
        out: list[str] = []
        while True:
            # A separator may straddle the previous scan's end: step back by its length.
            cut, sep = _find_event_end(self._buffer, max(0, self._scanned - 3))
            if cut < 0:
                self._scanned = len(self._buffer)
                return out
            raw = bytes(self._buffer[:cut])
            del self._buffer[: cut + sep]
            self._scanned = 0
            data = [line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in raw.splitlines()]
            lines = [d for d in data if d is not None]
            if lines:
                out.append(b"\n".join(lines).decode("utf-8", "replace"))


def _find_event_end(buffer: bytearray, start: int = 0) -> tuple[int, int]:
    best, size = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buffer.find(sep, start)
        if i >= 0 and (best < 0 or i < best):
            best, size = i, len(sep)
    return best, size


def named_event(event: dict) -> bytes:
    """`event` as an SSE event named by its ``type`` (the Responses and Messages streams)."""
    kind = event.get("type")
    head = f"event: {kind}\n".encode() if isinstance(kind, str) else b""
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


def encode_event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return b"data: " + data.encode() + b"\n\n"


def error_event(error: GatewayError) -> bytes:
    code = error.told_code if hasattr(error, "told_code") else error.code  # UpstreamErrorEvent: the provider's own
    return encode_event({"error": {"message": error.message, "type": error.type, "param": error.param, "code": code}})


async def end_with_error(response: web.StreamResponse, error: GatewayError) -> None:
    """End a started stream with `error` as its last event and close the connection (no
    [DONE]: the answer is not complete, and a client must not take it for one)."""
    await end_stream(response, error_event(error))


async def end_stream(response: web.StreamResponse, last: bytes) -> None:
    """End a started stream with the error event `last` (b"": none) and close the connection:
    no closing event of the format follows, so the client never takes the answer for complete."""
    response.force_close()
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client may be gone already
        if last:
            await response.write(last)
        await response.write_eof()


def _text_or_none(value) -> bool:
    return value is None or isinstance(value, str)


def _readable_call(call) -> bool:
    if not isinstance(call, dict):
        return False
    fn = call.get("function")
    return fn is None or (isinstance(fn, dict) and _text_or_none(fn.get("name")) and _text_or_none(fn.get("arguments")))


def readable_chunk(chunk: dict) -> bool:
    """Is `chunk` shaped like a chat.completion.chunk where the gateway reads it (choices,
    deltas, content, refusal, tool and function calls, finish reasons)? One that is not is left
    out by the code that rewrites streams, never a crash in the middle of the client's stream."""
    choices = chunk.get("choices")
    if choices is None:
        return True
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict) or not _text_or_none(choice.get("finish_reason")):
            return False
        delta = choice.get("delta")
        if delta is None:
            continue
        if not isinstance(delta, dict) or not all(_text_or_none(delta.get(k)) for k in ("role", "content", "refusal")):
            return False
        calls = delta.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(_readable_call(c) for c in calls)):
            return False
        if delta.get("function_call") is not None and not _readable_call({"function": delta["function_call"]}):
            return False
    return True


def readable_completion(data: dict) -> bool:
    """Choices the loop can read and rewrite: objects whose message is an object with, if any,
    a list of tool calls."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            return False
        calls = choice["message"].get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            return False
    return True


class ToolCallIndexer:
    """The index of each tool-call delta of one choice. Gemini's OpenAI-compatible stream (and
    some other servers) omit it; read as 0, parallel calls merged into one with both names and
    arguments. Without an index, a delta with a new id opens the next call and one without an id
    continues the call opened last."""

    def __init__(self) -> None:
        self._by_id: dict[str, int] = {}
        self._last: int | None = None
        self._next = 0

    def index(self, call: dict) -> int:
        idx = call.get("index")
        call_id = call.get("id")
        if not isinstance(idx, int) or isinstance(idx, bool):
            if isinstance(call_id, str) and call_id in self._by_id:
                idx = self._by_id[call_id]
            elif call_id or self._last is None:
                idx = self._next
            else:
                idx = self._last
        if isinstance(call_id, str) and call_id:
            self._by_id.setdefault(call_id, idx)
        self._last, self._next = idx, max(self._next, idx + 1)
        return idx

    def number(self, chunk: dict) -> None:
        """Give choice 0's tool-call deltas in `chunk` their index, in place."""
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    if isinstance(call, dict):
                        call["index"] = self.index(call)


class StreamAssembler:
    """Rebuilds choice 0's message (content, refusal, tool calls, a legacy function_call), the
    finish reason and usage from chat.completion.chunk events."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.role = "assistant"
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.function_call: dict[str, str] | None = None  # legacy `functions` answers
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self._indexer = ToolCallIndexer()
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.done = False

    def add(self, chunk: dict) -> None:
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("role"):
                self.role = delta["role"]
            if delta.get("content"):
                self.content.append(delta["content"])
            if delta.get("refusal"):
                self.refusal.append(delta["refusal"])
            if isinstance(delta.get("function_call"), dict):
                self.add_function_call_delta(delta["function_call"])
            for call in delta.get("tool_calls") or ():
                self.add_tool_call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def add_tool_call_delta(self, call: dict) -> None:
        slot = self.tool_calls.setdefault(self._indexer.index(call), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        for key, value in call.items():  # what a provider attaches to a call (Gemini's thought signature) goes back with it
            if key not in ("index", "id", "type", "function") and value is not None:
                slot[key] = value
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        fn = call.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            slot["function"]["arguments"] += fn["arguments"]

    def add_function_call_delta(self, call: dict) -> None:
        slot = self.function_call = self.function_call or {"name": "", "arguments": ""}
        for key in ("name", "arguments"):
            if isinstance(call.get(key), str):
                slot[key] += call[key]

    def message(self) -> dict:
        msg: dict[str, Any] = {"role": self.role, "content": "".join(self.content) or None}
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        if self.function_call:
            msg["function_call"] = self.function_call
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg
