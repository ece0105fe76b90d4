"""The exact client stream of a recall turn, for each wire format, against a recorded copy.

A scripted upstream (a real aiohttp app on port 0) answers each streamed call of the turn with
the next round of its script, in the format's own events: text, reasoning / thinking, tool
calls (the gateway's recall tools and the client's), a provider error event, an error status, a
stream cut short. The gateway in front of it offers the recall tools (the history hides an old
tool result), so every stream runs through the recall loop's stream filter. What the client
received, byte for byte, must equal ``stream_identity.json``: a change to the stream filter
that changes a client's stream fails here. ``PALIMPSEST_RECORD_STREAMS=1`` writes the file anew
(only for a change of what the client should see)."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

GOLDEN = Path(__file__).with_name("stream_identity.json")
MODEL = "fake-8k"
RECALL_NAMES = ("session_search", "session_load")

# A round is a list of parts: ("text", s), ("reasoning", s), ("call", id, name, arguments);
# or one fault: "error_event" (a partial answer, then the provider's error event), "status"
# (503 before any byte), "cut" (a partial answer, then the stream ends).
SEARCH = ("call", "call_s1", "session_search", '{"query": "deploy id"}')
LOAD = ("call", "call_l1", "session_load", '{"event_id": "x"}')
CLIENT = ("call", "call_c1", "read_file", '{"path": "log"}')
ANSWER = ("text", "The deploy id is DEP-4711.")
SCENARIOS = {
    "text": [[ANSWER]],
    "client_call": [[("text", "Reading."), CLIENT]],
    "recall_then_text": [[SEARCH], [ANSWER]],
    "recall_twice_then_text": [[SEARCH], [LOAD], [ANSWER]],
    "text_and_recall_then_text": [[("text", "Let me look."), SEARCH], [ANSWER]],
    "recall_then_client_call": [[SEARCH], [CLIENT]],
    "parallel_recall_and_client": [[SEARCH, CLIENT]],
    "parallel_client_and_recall": [[("text", "Both."), CLIENT, SEARCH]],
    "reasoning_recall_then_reasoning_text": [[("reasoning", "I should search."), SEARCH],
                                             [("reasoning", "Found it."), ANSWER]],
    "reasoning_then_recall_and_client": [[("reasoning", "Two things."), SEARCH, CLIENT]],
    "recall_then_error_event": [[SEARCH], "error_event"],
    "recall_then_status": [[SEARCH], "status"],
    "recall_then_cut": [[SEARCH], "cut"],
    "error_event_first": ["error_event"],
}


def _sse(event: dict, name: str | None = None) -> bytes:
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + orjson.dumps(event) + b"\n\n"


def _calls(round_: list) -> list:
    return [p for p in round_ if p[0] == "call"]


# -- each format's upstream events -------------------------------------------------------------

def chat_round(n: int, round_) -> bytes:
    head = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 100 + n, "model": MODEL}

    def chunk(delta: dict, finish=None) -> bytes:
        return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    out = chunk({"role": "assistant", "content": ""})
    if isinstance(round_, str):
        out += chunk({"content": "partial "})
        if round_ == "error_event":
            out += _sse({"error": {"message": "Overloaded", "type": "server_error", "param": None, "code": "overloaded"}})
        return out
    index = 0
    for part in round_:
        if part[0] == "text":
            half = len(part[1]) // 2
            out += chunk({"content": part[1][:half]}) + chunk({"content": part[1][half:]})
        elif part[0] == "reasoning":
            out += chunk({"reasoning_content": part[1]})
        else:
            out += chunk({"tool_calls": [{"index": index, "id": part[1], "type": "function",
                                          "function": {"name": part[2], "arguments": ""}}]})
            out += chunk({"tool_calls": [{"index": index, "function": {"arguments": part[3]}}]})
            index += 1
    out += _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if index else "stop"}]})
    out += _sse({**head, "choices": [], "usage": {"prompt_tokens": 1000 + n, "completion_tokens": 10 + n, "total_tokens": 1010 + 2 * n}})
    return out + b"data: [DONE]\n\n"


def responses_round(n: int, round_) -> bytes:
    events: list[dict] = []
    rid = f"resp_{n}"
    base = {"id": rid, "object": "response", "created_at": 200 + n, "model": MODEL, "tools": [{"type": "function", "name": "x"}]}
    events.append({"type": "response.created", "response": {**base, "status": "in_progress", "output": []}})
    events.append({"type": "response.in_progress", "response": {**base, "status": "in_progress", "output": []}})
    if isinstance(round_, str):
        events.append({"type": "response.output_item.added", "output_index": 0,
                       "item": {"type": "message", "id": f"msg_{n}", "role": "assistant", "content": []}})
        events.append({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": f"msg_{n}",
                       "delta": "partial "})
        if round_ == "error_event":
            events.append({"type": "error", "code": "overloaded", "message": "Overloaded", "param": None})
    else:
        output = []
        for i, part in enumerate(round_):
            if part[0] == "text":
                item = {"type": "message", "id": f"msg_{n}_{i}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": part[1], "annotations": []}]}
                deltas = [{"type": "response.output_text.delta", "content_index": 0, "item_id": item["id"], "delta": part[1]}]
            elif part[0] == "reasoning":
                item = {"type": "reasoning", "id": f"rs_{n}_{i}", "summary": [{"type": "summary_text", "text": part[1]}],
                        "encrypted_content": f"enc-{n}-{i}"}
                deltas = [{"type": "response.reasoning_summary_text.delta", "summary_index": 0, "item_id": item["id"],
                           "delta": part[1]}]
            else:
                item = {"type": "function_call", "id": f"fc_{n}_{i}", "call_id": part[1], "name": part[2],
                        "arguments": part[3], "status": "completed"}
                deltas = [{"type": "response.function_call_arguments.delta", "item_id": item["id"], "delta": part[3]}]
            events.append({"type": "response.output_item.added", "output_index": i, "item": {**item, "status": "in_progress"}})
            events += [{**d, "output_index": i} for d in deltas]
            events.append({"type": "response.output_item.done", "output_index": i, "item": item})
            output.append(item)
        usage = {"input_tokens": 1000 + n, "input_tokens_details": {"cached_tokens": 500}, "output_tokens": 10 + n,
                 "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 1010 + 2 * n}
        events.append({"type": "response.completed", "response": {**base, "status": "completed", "output": output, "usage": usage}})
    return b"".join(_sse({**e, "sequence_number": seq}, e["type"]) for seq, e in enumerate(events))


def messages_round(n: int, round_) -> bytes:
    events: list[dict] = [{"type": "message_start", "message": {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": MODEL, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 1000 + n, "cache_read_input_tokens": 400,
                                         "cache_creation_input_tokens": 7, "output_tokens": 1}}}]
    if isinstance(round_, str):
        events.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        events.append({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "partial "}})
        if round_ == "error_event":
            events.append({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    else:
        for i, part in enumerate(round_):
            if part[0] == "text":
                start, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": part[1]}]
            elif part[0] == "reasoning":
                start = {"type": "thinking", "thinking": ""}
                deltas = [{"type": "thinking_delta", "thinking": part[1]}, {"type": "signature_delta", "signature": f"sig-{n}-{i}"}]
            else:
                start = {"type": "tool_use", "id": part[1], "name": part[2], "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": part[3]}]
            events.append({"type": "content_block_start", "index": i, "content_block": start})
            if i == 0:
                events.append({"type": "ping"})
            events += [{"type": "content_block_delta", "index": i, "delta": d} for d in deltas]
            events.append({"type": "content_block_stop", "index": i})
        stop = "tool_use" if _calls(round_) else "end_turn"
        events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                       "usage": {"output_tokens": 10 + n}})
        events.append({"type": "message_stop"})
    return b"".join(_sse(e, e["type"]) for e in events)


# -- each format's client request --------------------------------------------------------------

def _history() -> list[tuple[str, str]]:
    """(step, tool output) rounds: the first output is big (the view hides it: recall is offered)."""
    return [(f"step {i}", ("The deploy id is DEP-4711. " if i == 0 else "") + f"line {i} of the build log. " * (900 if i == 0 else 5))
            for i in range(5)]


def chat_body() -> dict:
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}]
    for i, (ask, output) in enumerate(_history()):
        messages += [{"role": "user", "content": ask},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "log"}'}}]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
                     {"role": "assistant", "content": f"done {i}"}]
    messages.append({"role": "user", "content": "What is the deploy id?"})
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    return {"model": MODEL, "messages": messages, "tools": [tool], "stream": True, "stream_options": {"include_usage": True}}


def responses_body() -> dict:
    items: list[dict] = []
    for i, (ask, output) in enumerate(_history()):
        items += [{"role": "user", "content": ask},
                  {"type": "function_call", "call_id": f"call_{i}", "name": "read_file", "arguments": '{"path": "log"}'},
                  {"type": "function_call_output", "call_id": f"call_{i}", "output": output},
                  {"role": "assistant", "content": f"done {i}"}]
    items.append({"role": "user", "content": "What is the deploy id?"})
    tool = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
    return {"model": MODEL, "instructions": "You are an agent.", "input": items, "tools": [tool], "stream": True, "store": False}


def messages_body() -> dict:
    messages: list[dict] = []
    for i, (ask, output) in enumerate(_history()):
        messages += [{"role": "user", "content": ask},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                                                        "input": {"path": "log"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output}]},
                     {"role": "assistant", "content": [{"type": "text", "text": f"done {i}"}]}]
    messages.append({"role": "user", "content": "What is the deploy id?"})
    tool = {"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
    return {"model": MODEL, "max_tokens": 1024, "system": "You are an agent.", "messages": messages, "tools": [tool],
            "stream": True}


FORMATS = {
    "chat": ("/v1/chat/completions", chat_round, chat_body, {"Authorization": "Bearer sk-ident"}),
    "responses": ("/v1/responses", responses_round, responses_body, {"Authorization": "Bearer sk-ident"}),
    "messages": ("/v1/messages", messages_round, messages_body, {"x-api-key": "sk-ident", "anthropic-version": "2023-06-01"}),
}


# -- the scripted upstream ---------------------------------------------------------------------

SCRIPT: web.AppKey[dict] = web.AppKey("script", dict)


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "context_length": 8000}]})


async def _answer(request: web.Request) -> web.StreamResponse:
    script = request.app[SCRIPT]
    body = await request.json()
    if request.headers.get("x-palimpsest-purpose") or not body.get("stream"):
        return web.json_response({"error": {"message": "not scripted", "type": "server_error"}}, status=503)
    script["received"].append(body)
    n = len(script["received"]) - 1
    round_ = script["rounds"][n]
    if round_ == "status":
        return web.json_response({"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}, status=503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(script["render"](n, round_))
    await response.write_eof()
    return response


@pytest.fixture
async def scripted():
    app = web.Application()
    app[SCRIPT] = {"received": [], "rounds": [], "render": None}
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/{tail:.*}", _answer)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield app[SCRIPT], f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


def _recorded() -> dict:
    return orjson.loads(GOLDEN.read_bytes()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_the_client_stream_is_the_recorded_one(fmt, scenario, scripted, start_gateway):
    script, base = scripted
    path, render, body, headers = FORMATS[fmt]
    script["rounds"], script["render"] = SCENARIOS[scenario], render
    gw = await start_gateway(upstream={"base_url": base})
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.root + path, data=orjson.dumps(body()),
                             headers={"Content-Type": "application/json", "X-Session-Id": f"s-{fmt}-{scenario}", **headers}) as resp:
            got = {"status": resp.status, "stream": (await resp.read()).decode()}
    # The turn went through the recall loop: recall was offered, and every scripted round was asked for.
    first = orjson.dumps(script["received"][0]["tools"]).decode()
    assert all(name in first for name in RECALL_NAMES), first
    assert len(script["received"]) == len(SCENARIOS[scenario])
    key = f"{fmt}/{scenario}"
    if os.environ.get("PALIMPSEST_RECORD_STREAMS") == "1":
        recorded = _recorded()
        recorded[key] = got
        GOLDEN.write_bytes(orjson.dumps(recorded, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
        return
    assert got == _recorded()[key]
