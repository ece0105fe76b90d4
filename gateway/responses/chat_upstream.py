"""Responses requests on an upstream that serves only Chat Completions (``[models."x"] api = "chat"``).

The Responses half of ``gateway/pipeline/chat_transport.py``: the Responses body rendered as a
Chat Completions body (the neutral view is already chat-shaped), the answer translated back into
a Responses object, or the chunk stream into Responses events, so the client (Codex CLI, the
Agents SDK) sees the API it spoke. What a chat upstream cannot take is left out and said in a response header
(``x-palimpsest-dropped``): reasoning items (they are bound to the provider that made them) and
tools other than functions.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from gateway.pipeline.chat_transport import ChatTransport, translated_stream
from gateway.responses import adapter as fmt
from gateway.http.sse import StreamAssembler
from gateway.responses.stream import encode
from policies.conversation import wire_items

PASSED_KEYS = ("temperature", "top_p", "parallel_tool_calls", "user", "metadata", "stream", "seed")


def chat_body(body: dict) -> tuple[dict, dict[str, int]]:
    """A Responses body as Chat Completions, and what had to be left out (kind -> count)."""
    _, history = fmt.to_neutral(fmt.input_items(body.get("input")), hoist=False)
    dropped: dict[str, int] = {}
    messages: list[dict] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    for message in history:
        messages.append(chat_message(message, dropped))
    out: dict = {"model": body.get("model"), "messages": messages}
    for key in PASSED_KEYS:
        if body.get(key) is not None:
            out[key] = body[key]
    if isinstance(body.get("max_output_tokens"), int):
        out["max_tokens"] = body["max_output_tokens"]
    tools = []
    for tool in body.get("tools") or ():
        if tool.get("type") == "function" and isinstance(tool.get("name"), str):
            fn = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
            if tool.get("description"):
                fn["description"] = tool["description"]
            tools.append({"type": "function", "function": fn})
        else:
            dropped["tool"] = dropped.get("tool", 0) + 1
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, str):
            out["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out.pop("parallel_tool_calls", None)
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True}
    return out, dropped


def chat_message(message: dict, dropped: dict[str, int]) -> dict:
    role = message.get("role")
    out: dict = {"role": role if role in ("user", "assistant", "tool") else "system"}
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.get("type") == "text":
                parts.append(part)
            elif part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            else:
                dropped[str(part.get("type"))] = dropped.get(str(part.get("type")), 0) + 1
        content = parts
    if role == "assistant":
        out["content"] = content or None
        if message.get("tool_calls"):
            out["tool_calls"] = message["tool_calls"]
        elif not content:
            out["content"] = ""
        for item in wire_items(message, fmt.FORMAT) or ():
            if item.get("type") not in ("message", "function_call"):
                dropped[str(item.get("type"))] = dropped.get(str(item.get("type")), 0) + 1
    else:
        out["content"] = content if content is not None else ""
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def usage_of(usage: dict | None) -> dict | None:
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    return {"input_tokens": usage.get("prompt_tokens") or 0,
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens") or 0},
            "output_tokens": usage.get("completion_tokens") or 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens") or 0}


def output_of(message: dict, base: str) -> list[dict]:
    """Responses output items for a chat assistant message."""
    out = []
    if message.get("content"):
        out.append({"type": "message", "id": f"msg_{base}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for n, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        out.append({"type": "function_call", "id": f"fc_{base}_{n}", "call_id": call.get("id"), "name": fn.get("name"),
                    "arguments": fn.get("arguments") or "", "status": "completed"})
    return out


def minted() -> str:
    """A fresh base for the ids of one translated response (``resp_``, ``msg_``, ``fc_``): the
    gateway mints them, so they are unique whatever the upstream's completion ids are (some
    servers reuse one, or send none). Response ids are how tenants name what was recorded."""
    return secrets.token_hex(12)


def response_of(completion: dict, body: dict, base: str | None = None) -> dict:
    base = base or minted()
    choice = (completion.get("choices") or [{}])[0]
    finish = choice.get("finish_reason")
    return {"id": f"resp_{base}", "object": "response", "created_at": completion.get("created") or int(time.time()),
            "status": "incomplete" if finish == "length" else "completed", "model": completion.get("model") or body.get("model"),
            "output": output_of(choice.get("message") or {}, base), "usage": usage_of(completion.get("usage")),
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "error": None, "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None}


@dataclass
class EventWriter:
    """Responses events for a chat completion stream, as its chunks arrive."""

    body: dict
    seq: int = 0
    base: str = ""
    opened: bool = False
    assembler: StreamAssembler = field(default_factory=StreamAssembler)
    text_index: int | None = None
    call_index: dict[int, int] = field(default_factory=dict)
    next_index: int = 0

    def _event(self, kind: str, **fields) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return encode(event)

    def chunk(self, data: dict) -> bytes:
        out = bytearray()
        if not self.opened:
            self.opened = True
            self.base = minted()
            skeleton = {**response_of({"id": data.get("id"), "created": data.get("created"), "model": data.get("model"),
                                       "choices": [{"message": {}}]}, self.body, self.base),
                        "status": "in_progress", "output": [], "usage": None}
            out += self._event("response.created", response=skeleton)
            out += self._event("response.in_progress", response=skeleton)
        self.assembler.add(data)
        for choice in data.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text_index is None:
                    self.text_index = self.next_index
                    self.next_index += 1
                    item = {"type": "message", "id": f"msg_{self.base}", "status": "in_progress", "role": "assistant", "content": []}
                    out += self._event("response.output_item.added", output_index=self.text_index, item=item)
                    out += self._event("response.content_part.added", output_index=self.text_index, item_id=item["id"],
                                       content_index=0, part={"type": "output_text", "text": "", "annotations": []})
                out += self._event("response.output_text.delta", output_index=self.text_index, item_id=f"msg_{self.base}",
                                   content_index=0, delta=delta["content"])
            for call in delta.get("tool_calls") or ():
                idx = call.get("index", 0)
                if idx not in self.call_index:
                    self.call_index[idx] = self.next_index
                    self.next_index += 1
                    fn = call.get("function") or {}
                    item = {"type": "function_call", "id": f"fc_{self.base}_{idx}", "call_id": call.get("id"),
                            "name": fn.get("name") or "", "arguments": "", "status": "in_progress"}
                    out += self._event("response.output_item.added", output_index=self.call_index[idx], item=item)
                args = (call.get("function") or {}).get("arguments")
                if args:
                    out += self._event("response.function_call_arguments.delta", output_index=self.call_index[idx],
                                       item_id=f"fc_{self.base}_{idx}", delta=args)
        return bytes(out)

    def close(self) -> bytes:
        """The items' done events and the terminal event (None of it if nothing arrived)."""
        if not self.opened:
            return b""
        message = self.assembler.message()
        completion = {"id": self.assembler.id, "created": self.assembler.created, "model": self.assembler.model,
                      "usage": self.assembler.usage,
                      "choices": [{"message": message, "finish_reason": self.assembler.finish_reason}]}
        response = response_of(completion, self.body, self.base)
        out = bytearray()
        for item in response["output"]:
            index = self.text_index if item["type"] == "message" else self.call_index.get(int(item["id"].rsplit("_", 1)[1]))
            if item["type"] == "message":
                text = item["content"][0]["text"]
                out += self._event("response.output_text.done", output_index=index, item_id=item["id"], content_index=0, text=text)
                out += self._event("response.content_part.done", output_index=index, item_id=item["id"], content_index=0,
                                   part=item["content"][0])
            else:
                out += self._event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                                   arguments=item["arguments"])
            out += self._event("response.output_item.done", output_index=index, item=item)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        out += self._event(kind, response=response)
        return bytes(out)


class ChatUpstream(ChatTransport):
    """The upstream seen through Chat Completions, for Responses clients."""

    def convert(self, request: dict) -> tuple[dict, dict[str, int]]:
        return chat_body(request)

    def answer(self, completion: dict, request: dict) -> dict:
        return response_of(completion, request)

    async def events(self, reader, request: dict):
        async for out in translated_stream(reader, EventWriter(request), lambda error: encode({"type": "error", **error})):
            yield out
