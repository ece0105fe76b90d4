"""Messages requests on an upstream that serves only Chat Completions (``[models."x"] api = "chat"``).

The Messages half of ``gateway/pipeline/chat_transport.py``, so Claude Code runs on any
OpenAI-compatible model: the Messages body (the client's, or the view the gateway rendered) is
read into the neutral model (``adapter.to_neutral``) and written as Chat Completions: ``system``
and the system messages before the first turn as system messages (one inside the conversation as
a ``<system-reminder>`` in the tool result or user turn it follows: chat templates take system
messages only first), ``tool_use`` blocks as tool calls, each ``tool_result``
block as a tool message right after them, text and images as content parts, client tools as
function tools, ``tool_choice`` and ``stop_sequences`` in their chat form. The answer comes back
as a Messages ``message`` (``tool_use`` blocks with the parsed arguments, the stop reason and the
usage in Anthropic's terms), a stream as Messages events (``message_start``, one block per text
run or call, ``message_delta`` with the stop reason and usage, ``message_stop``), an error in
Anthropic's envelope.

Left out, and named in ``x-palimpsest-dropped``: ``thinking`` / ``redacted_thinking`` blocks
(their signatures bind them to the provider that made them), other opaque blocks (server tool
results, documents), images inside tool results, and tools other than the client's own
functions (Anthropic's server tools). The ledger keeps all of it: a session that goes back to an
Anthropic model sends its thinking blocks again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson
from multidict import CIMultiDict

from gateway.http.errors import anthropic_error_type
from gateway.http.sse import StreamAssembler
from gateway.messages import adapter as fmt
from gateway.messages.stream import encode
from gateway.pipeline.chat_transport import ChatTransport, arguments_object, count, translated_stream
from policies.conversation import wire_items

STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
         "content_filter": "refusal"}
# Client headers of Anthropic's API that mean nothing to a chat upstream.
ANTHROPIC_HEADERS = ("anthropic-version", "anthropic-beta")


def chat_body(body: dict) -> tuple[dict, dict[str, int]]:
    """A Messages body as Chat Completions, and what had to be left out (kind -> count)."""
    dropped: dict[str, int] = {}
    messages: list[dict] = []
    system = fmt.system_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or ():  # system messages before the first turn
        if message.get("role") != "system":
            break
        messages.append({"role": "system", "content": fmt.system_text(message.get("content"))})
    _, history = fmt.to_neutral(body.get("messages") or [])
    for item in history:
        _add(messages, chat_message(item, dropped))
        for after in (item.get("wire") or {}).get("after") or ():
            _system_inside(messages, fmt.system_text(after.get("content")))
    out: dict = {"model": body.get("model"), "messages": messages}
    if isinstance(body.get("max_tokens"), int):
        out["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    if isinstance(body.get("stop_sequences"), list) and body["stop_sequences"]:
        out["stop"] = body["stop_sequences"][:4]
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user, str):
        out["user"] = user
    tools = []
    for tool in body.get("tools") or ():
        if tool.get("type") in (None, "custom") and isinstance(tool.get("name"), str):
            fn = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
            if tool.get("description"):
                fn["description"] = tool["description"]
            tools.append({"type": "function", "function": fn})
        else:
            count(dropped, "tool")
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice") if isinstance(body.get("tool_choice"), dict) else {}
        kind = choice.get("type")
        if kind in ("auto", "none"):
            out["tool_choice"] = kind
        elif kind == "any":
            out["tool_choice"] = "required"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        if choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True}
    return out, dropped


def _add(messages: list[dict], message: dict) -> None:
    """Append `message`, merged into the one before when both are user turns."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "user" or message["role"] != "user":
        messages.append(message)
        return
    parts = [*_as_parts(last["content"]), *_as_parts(message["content"])]
    last["content"] = parts


def _system_inside(messages: list[dict], text: str) -> None:
    """A system message inside the conversation, where a chat upstream can take it (chat
    templates take system messages only first): as a ``<system-reminder>`` (what Claude Code
    calls the harness's own text) at the end of the tool result or user turn it follows, else
    as a user turn of its own. The model's next turn still answers what came before it."""
    if not text:
        return
    reminder = text if text.lstrip().startswith("<system-reminder>") else f"<system-reminder>\n{text}\n</system-reminder>"
    if messages and messages[-1]["role"] == "tool":
        messages[-1]["content"] = f"{messages[-1]['content']}\n\n{reminder}"
        return
    _add(messages, {"role": "user", "content": reminder})


def _as_parts(content) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or ())


def _parts(content, dropped: dict[str, int], *, images: bool = True) -> str | list[dict]:
    """Neutral content as chat content: text parts, base64 / URL images as image_url parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict] = []
    for part in content:
        kind = part.get("type")
        source = part.get("source") if isinstance(part.get("source"), dict) else {}
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif images and kind == "image" and source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif images and kind == "image" and source.get("type") == "url":
            parts.append({"type": "image_url", "image_url": {"url": source.get("url")}})
        else:
            count(dropped, kind)
    return parts


def chat_message(message: dict, dropped: dict[str, int]) -> dict:
    role = message.get("role")
    if role == "tool":
        content = _parts(message.get("content"), dropped, images=False)
        text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)
        return {"role": "tool", "tool_call_id": message.get("tool_call_id"), "content": text}
    if role == "assistant":
        out: dict = {"role": "assistant", "content": message.get("content") or None}
        if message.get("tool_calls"):
            out["tool_calls"] = message["tool_calls"]
        elif not out["content"]:
            out["content"] = ""
        for block in wire_items(message, fmt.FORMAT) or ():
            if block.get("type") not in ("text", "tool_use"):
                count(dropped, block.get("type"))
        return out
    return {"role": "user", "content": _parts(message.get("content"), dropped)}


def usage_of(usage) -> dict:
    """Chat usage in Anthropic's terms: input_tokens excludes what the cache served."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else 0
    cached = details.get("cached_tokens") if isinstance(details.get("cached_tokens"), int) else 0
    output = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else 0
    return {"input_tokens": max(0, prompt - cached), "output_tokens": output,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _id(completion: dict) -> str:
    return "msg_" + str(completion.get("id") or f"chat{int(time.time() * 1000)}").removeprefix("chatcmpl-")


def message_of(completion: dict, body: dict) -> dict:
    """A chat completion (choice 0) as a Messages ``message``."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                        "input": arguments_object(fn.get("arguments"))})
    stop = "tool_use" if message.get("tool_calls") else STOPS.get(choice.get("finish_reason"), "end_turn")
    return {"id": _id(completion), "type": "message", "role": "assistant", "model": completion.get("model") or body.get("model"),
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage_of(completion.get("usage"))}


@dataclass
class EventWriter:
    """Messages events for a chat completion stream, as its chunks arrive."""

    body: dict
    opened: bool = False
    assembler: StreamAssembler = field(default_factory=StreamAssembler)
    index: int = -1  # the open block's index (-1: none)
    open_kind: str = ""  # "text", or "call:<chat index>"

    def _start(self, block: dict, kind: str) -> bytes:
        out = self._stop()
        self.index += 1
        self.open_kind = kind
        return out + encode({"type": "content_block_start", "index": self.index, "content_block": block})

    def _stop(self) -> bytes:
        if not self.open_kind:
            return b""
        self.open_kind = ""
        return encode({"type": "content_block_stop", "index": self.index})

    def chunk(self, data: dict) -> bytes:
        out = bytearray()
        if not self.opened:
            self.opened = True
            start = {**message_of({"id": data.get("id"), "model": data.get("model")}, self.body), "content": [],
                     "stop_reason": None, "usage": usage_of(None)}
            out += encode({"type": "message_start", "message": start})
        self.assembler.add(data)
        for choice in data.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                if self.open_kind != "text":
                    out += self._start({"type": "text", "text": ""}, "text")
                out += encode({"type": "content_block_delta", "index": self.index,
                               "delta": {"type": "text_delta", "text": delta["content"]}})
            for call in delta.get("tool_calls") or ():
                kind = f"call:{call.get('index', 0)}"
                fn = call.get("function") or {}
                if self.open_kind != kind:
                    out += self._start({"type": "tool_use", "id": call.get("id"), "name": fn.get("name") or "", "input": {}}, kind)
                if fn.get("arguments"):
                    out += encode({"type": "content_block_delta", "index": self.index,
                                   "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
        return bytes(out)

    def close(self) -> bytes:
        """The open block's stop, the stop reason and usage, and ``message_stop``."""
        if not self.opened:
            return b""
        message = self.assembler.message()
        stop = "tool_use" if message.get("tool_calls") else STOPS.get(self.assembler.finish_reason, "end_turn")
        return self._stop() + encode({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": usage_of(self.assembler.usage)}) + encode({"type": "message_stop"})


class MessagesChatUpstream(ChatTransport):
    """The upstream seen through Chat Completions, for Messages clients (Claude Code)."""

    def convert(self, request: dict) -> tuple[dict, dict[str, int]]:
        return chat_body(request)

    def answer(self, completion: dict, request: dict) -> dict:
        return message_of(completion, request)

    def error(self, status: int, payload: bytes) -> bytes:
        """The chat upstream's error (OpenAI's envelope) in Anthropic's."""
        try:
            error = orjson.loads(payload).get("error")
            message = error.get("message") if isinstance(error, dict) else error
        except (orjson.JSONDecodeError, AttributeError):
            message = None
        if not isinstance(message, str):
            message = payload.decode("utf-8", "replace")[:500] or f"The upstream answered {status}."
        return orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})

    def incoming(self, headers):
        """Claude Code's ``x-api-key`` as the Bearer token a chat upstream reads (when the gateway
        has no key of its own to put there); Anthropic's version and beta headers left out."""
        out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in ANTHROPIC_HEADERS)
        if "x-api-key" in out and "Authorization" not in out:
            out["Authorization"] = f"Bearer {out.popall('x-api-key')[0]}"
        return out

    async def events(self, reader, request: dict):
        def error_event(error: dict) -> bytes:
            return encode({"type": "error", "error": {"type": error.get("type") or "api_error",
                                                      "message": error.get("message") or "upstream error"}})

        async for out in translated_stream(reader, EventWriter(request), error_event):
            yield out
