"""A scripted fake upstream for the new-user probes (tests/robustness/test_new_user_*.py).

Each test decides what the "provider" answers with a plain function of the request body
(``Scripted.script``): a JSON completion, an error status, or a list of SSE events sent one by
one. Every request is kept (body, headers, purpose) so a test asserts on what the upstream
received as well as on what the openai SDK gave the client. Summary requests
(``x-palimpsest-purpose: summary``) get a well-formed summary from the simulator unless the
test sets ``Scripted.summary``.

The fixtures that start it (`scripted`, `scripted_gateway`) live in tests/robustness/conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import openai
import orjson
from aiohttp import web

from simulator.summary import render_summary

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_CLIENTS: list[openai.AsyncOpenAI] = []  # closed when the test's upstream stops


@dataclass
class Reply:
    status: int = 200
    json: Any = None  # a JSON body
    events: list[Any] | None = None  # SSE: dicts, "[DONE]" or raw bytes
    headers: dict[str, str] = field(default_factory=dict)


def completion(message: dict, finish: str | None = "stop", usage: dict | None = None, model: str = "m", **extra) -> Reply:
    body = {"id": "chatcmpl-s", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "logprobs": None, "finish_reason": finish}],
            **extra}
    if usage is not False:
        body["usage"] = usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    return Reply(json=body)


def chunk(delta: dict, finish: str | None = None, index: int = 0, **extra) -> dict:
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}


def stream_of(message: dict, finish: str = "stop", usage: dict | None = None, pieces: int = 3) -> Reply:
    """The SSE form of `message`: role chunk, content and tool-call arguments cut in `pieces`."""
    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    step = max(1, len(content) // pieces)
    for start in range(0, len(content), step):
        events.append(chunk({"content": content[start:start + step]}))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        events.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": fn["name"], "arguments": ""}}]}))
        args = fn["arguments"]
        cut = max(1, len(args) // pieces)
        for start in range(0, len(args), cut):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[start:start + cut]}}]}))
    events.append(chunk({}, finish=finish))
    if usage is not False:
        events.append({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                       "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})
    events.append("[DONE]")
    return Reply(events=events)


def answer(body: dict, message: dict, finish: str = "stop", usage: dict | None = None) -> Reply:
    """`message` as the request asked for it: streamed or not."""
    if body.get("stream"):
        return stream_of(message, finish, usage)
    return completion(message, finish, usage)


def last_text(body: dict) -> str:
    for message in reversed(body["messages"]):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def default_script(body: dict) -> Reply:
    return answer(body, {"content": f"ok: {last_text(body)[:30]}"})


class Scripted:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.script: Callable[[dict], Reply] = default_script
        self.summary: Callable[[dict], Reply] | None = None

    def chats(self) -> list[dict]:
        """Bodies of the chat requests made for the client (not summaries)."""
        return [r["body"] for r in self.received if r["purpose"] != "summary"]

    def summaries(self) -> list[dict]:
        return [r for r in self.received if r["purpose"] == "summary"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        purpose = request.headers.get("x-palimpsest-purpose")
        self.received.append({"body": body, "headers": dict(request.headers), "purpose": purpose})
        if purpose == "summary":
            reply = self.summary(body) if self.summary else completion({"content": render_summary(body["messages"])})
        else:
            reply = self.script(body)
        if reply.events is None:
            return web.json_response(reply.json, status=reply.status, headers=reply.headers)
        response = web.StreamResponse(status=reply.status, headers={**SSE_HEADERS, **reply.headers})
        await response.prepare(request)
        for event in reply.events:
            if isinstance(event, bytes):
                await response.write(event)
            elif event == "[DONE]":
                await response.write(b"data: [DONE]\n\n")
            else:
                await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write_eof()
        return response


async def close_clients() -> None:
    """Close the SDK clients `client` made (the `scripted` fixture does it when its upstream stops)."""
    while _CLIENTS:
        await _CLIENTS.pop().close()


def add_call_deltas(calls: dict, deltas) -> None:
    """Fold a stream chunk's tool-call deltas into `calls` (index -> call), as a client does."""
    for delta in deltas or ():
        slot = calls.setdefault(delta.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        slot["id"] = delta.id or slot["id"]
        slot["function"]["name"] += delta.function.name or ""
        slot["function"]["arguments"] += delta.function.arguments or ""


def client(gateway, session: str | None = "s1", key: str = "sk-new-user", **headers: str) -> openai.AsyncOpenAI:
    if session is not None:
        headers = {"X-Session-Id": session, **headers}
    sdk = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30, default_headers=headers)
    _CLIENTS.append(sdk)
    return sdk
