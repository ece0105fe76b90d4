"""Streaming: the SSE chunks the official SDK parses, with stalls, resets and client disconnects."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from simulator.state import PUPPET_STATE


def ratelimit_headers() -> dict[str, str]:
    return {"x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-limit-tokens": "30000000", "x-ratelimit-remaining-tokens": "29999000",
            "openai-processing-ms": "1"}


class _Cut(Exception):
    """The stream's scripted reset is due."""


def stream_faults(request: web.Request, marks: dict[str, float]) -> tuple[float, int]:
    """(seconds to stall after the first event, events before a reset; 0: none) for one
    streamed answer: the next of the state's ``stream_faults`` (a summary call takes none), else
    the last message's ``[[stall S]]`` / ``[[die N]]``."""
    state = request.app[PUPPET_STATE]
    if state.stream_faults and request.headers.get("x-palimpsest-purpose", "").lower() != "summary":
        kind, value = state.stream_faults.pop(0)
        return (value, 0) if kind == "stall" else (0.0, max(1, int(value)))
    return marks.get("stall", 0.0), int(marks.get("die", 0))


async def cut(request: web.Request) -> None:
    """End a stream the way a dropped connection does: what was written has time to reach the
    client, then the connection is reset (no end of the chunked body, no final event)."""
    await asyncio.sleep(0.05)
    if request.transport is not None:
        request.transport.abort()


async def stream_completion(request: web.Request, head: dict[str, Any],
                            choices: list[dict[str, Any]], usage: dict[str, Any] | None,
                            body: dict[str, Any], stall_s: float, die_after: int = 0) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
        "x-simulated-provider": "palimpsest-puppet", "x-request-id": f"req_{head['id'][8:]}",
        **ratelimit_headers()})
    await response.prepare(request)
    base = {**head, "object": "chat.completion.chunk"}
    sent = 0

    async def send(index: int | None, delta: dict[str, Any] | None, finish: str | None = None,
                   chunk_usage: dict[str, Any] | None = None) -> None:
        nonlocal sent
        chunk = dict(base)
        chunk["choices"] = [] if index is None else [
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]
        if include_usage:
            chunk["usage"] = chunk_usage
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        sent += 1
        if sent == die_after:
            raise _Cut
        if state.chunk_delay_s:
            await asyncio.sleep(state.chunk_delay_s)

    try:
        for choice in choices:
            i, message = choice["index"], choice["message"]
            calls = message.get("tool_calls") or []
            refusal = message.get("refusal")
            first = {"role": "assistant", "content": None if calls or refusal else "", "refusal": None}
            await send(i, first)
            if stall_s:
                await stall(request, stall_s)
            for piece in pieces(message.get("reasoning_content") or "", state.chunk_chars):
                await send(i, {"reasoning_content": piece})
            for piece in pieces(refusal or "", state.chunk_chars):
                await send(i, {"refusal": piece})
            for piece in pieces(message["content"] or "", state.chunk_chars):
                await send(i, {"content": piece})
            for k, call in enumerate(calls):
                fn = call["function"]
                await send(i, {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                               "function": {"name": fn["name"], "arguments": ""}}]})
                for piece in pieces(fn["arguments"], state.chunk_chars):
                    await send(i, {"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
            await send(i, {}, choice["finish_reason"])
        if include_usage and usage is not None:  # a model that reports no usage sends no usage chunk
            await send(None, None, chunk_usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except _Cut:
        await cut(request)
    except (ConnectionResetError, asyncio.CancelledError):
        state.disconnected.append(head["id"])
        raise
    return response


async def stall(request: web.Request, seconds: float) -> None:
    """Sleep, but notice a client that went away (handler cancellation is off by default)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected")
        await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[k:k + size] for k in range(0, len(text), size)]

