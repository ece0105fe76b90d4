"""The Responses API's stream: the events, in the order, the openai SDK's accumulator parses.

``response.created`` and ``response.in_progress``, then per output item ``output_item.added``,
its parts and deltas (``content_part.*`` and ``output_text.*`` for a message,
``function_call_arguments.*`` for a call, ``compaction.compacting`` for a compaction), and
``output_item.done``; last ``response.completed`` with the whole response and its usage. Every
event has an ``event:`` line and a ``sequence_number`` counting from 0.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
from aiohttp import web

from simulator.state import PUPPET_STATE
from simulator.streaming import cut, pieces, stall, ratelimit_headers


def events(response: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    """Every event of the stream of `response`, without sequence numbers."""
    start = copy.deepcopy(response)
    start.update(status="in_progress", output=[], usage=None, completed_at=None)
    out: list[dict[str, Any]] = [{"type": "response.created", "response": start},
                                 {"type": "response.in_progress", "response": start}]
    for index, item in enumerate(response["output"]):
        out.extend(_item_events(index, item, chunk_chars))
    out.append({"type": "response.completed" if response["status"] == "completed" else "response.incomplete",
                "response": response})
    return out


def _item_events(index: int, item: dict[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    at = {"output_index": index}
    kind = item["type"]
    if kind == "message":
        added = {**item, "status": "in_progress", "content": []}
        out = [{"type": "response.output_item.added", **at, "item": added}]
        for k, part in enumerate(item["content"]):
            where = {"item_id": item["id"], **at, "content_index": k}
            if part["type"] == "refusal":
                out.append({"type": "response.content_part.added", **where, "part": {"type": "refusal", "refusal": ""}})
                out += [{"type": "response.refusal.delta", **where, "delta": piece}
                        for piece in pieces(part["refusal"], chunk_chars)]
                out.append({"type": "response.refusal.done", **where, "refusal": part["refusal"]})
                out.append({"type": "response.content_part.done", **where, "part": part})
                continue
            out.append({"type": "response.content_part.added", **where,
                        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
            for piece in pieces(part["text"], chunk_chars):
                out.append({"type": "response.output_text.delta", **where, "delta": piece,
                            "logprobs": []})
            out.append({"type": "response.output_text.done", **where, "text": part["text"],
                        "logprobs": []})
            out.append({"type": "response.content_part.done", **where, "part": part})
    elif kind == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        out = [{"type": "response.output_item.added", **at, "item": added}]
        for piece in pieces(item["arguments"], chunk_chars):
            out.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                        **at, "delta": piece})
        out.append({"type": "response.function_call_arguments.done", "item_id": item["id"], **at,
                    "name": item["name"], "arguments": item["arguments"]})
    elif kind == "compaction":
        out = [{"type": "response.output_item.added", **at,
                "item": {**item, "encrypted_content": ""}},
               {"type": "response.compaction.compacting", "item_id": item["id"], **at}]
    else:  # reasoning: announced and finished whole
        out = [{"type": "response.output_item.added", **at, "item": item}]
    out.append({"type": "response.output_item.done", **at, "item": item})
    return out


async def stream_response(request: web.Request, response: dict[str, Any],
                          stall_s: float, die_after: int = 0) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    stream = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
        "x-simulated-provider": "palimpsest-puppet", "x-request-id": f"req_{response['id'][5:]}",
        **ratelimit_headers()})
    await stream.prepare(request)
    try:
        for number, event in enumerate(events(response, state.chunk_chars)):
            event = {"type": event["type"], "sequence_number": number,
                     **{k: v for k, v in event.items() if k != "type"}}
            await stream.write(b"event: " + event["type"].encode() + b"\ndata: "
                               + orjson.dumps(event) + b"\n\n")
            if number + 1 == die_after:
                await cut(request)
                return stream
            if number == 1 and stall_s:
                await stall(request, stall_s)
            if state.chunk_delay_s:
                await asyncio.sleep(state.chunk_delay_s)
        await stream.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        state.disconnected.append(response["id"])
        raise
    return stream
