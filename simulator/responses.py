"""``POST /v1/responses`` on the simulated provider, strict like OpenAI's Responses API.

The request's context (the stored chain of ``previous_response_id``, then ``input``) is checked
(simulator.responses_input), turned into chat messages and answered by the same script as the
chat route (simulator.script.decide). Calls come with a reasoning item before them when
``include`` asks for ``reasoning.encrypted_content``: its encrypted content is signed and names
the calls it precedes, so replaying a call without it, or it without its calls, is a 400 as on
the real API. Responses are kept by id unless ``store`` is false (GET, DELETE, input_items).
A ``compaction_trigger`` as the last item, or ``POST /v1/responses/compact``, is answered with a
signed ``compaction`` item that later requests may carry instead of the history.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from simulator.counting import content_text, count_text
from simulator.errors import PuppetError, injected_failure, invalid
from simulator.responses_input import (as_items, chat_tools, check_context, count_context,
                                       item_type, reasoning_text, to_chat, validate_body,
                                       window_error)
from simulator.responses_stream import stream_response
from simulator.script import Answer, decide, markers
from simulator.signing import sign
from simulator.state import PUPPET_STATE, PuppetState, cached_prefix, record, summary_faults
from simulator.streaming import ratelimit_headers, stream_faults
from simulator.summary import render_summary
from simulator.validation import parse_json_body

ENCRYPTED = "reasoning.encrypted_content"
MAX_STORED = 5_000  # responses kept by id


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    await record(request, raw, body)
    if body is None:
        parse_json_body(raw)
    validate_body(body)
    return body


def _context(state: PuppetState, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The items the model sees: the stored chain, then this request's input."""
    prior: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous:
        stored = state.responses.get(previous)
        if stored is None:
            raise invalid(f"Previous response with id '{previous}' not found.",
                          param="previous_response_id", code="previous_response_not_found")
        prior = stored["context"] + stored["output"]
    items = prior + as_items(body.get("input"))
    check_context(items, state.secret, state.bound_reasoning, StoredIds(state))
    return items


class StoredIds:
    """The ids of every stored item, gathered only when a rule asks (most requests never do)."""

    def __init__(self, state: PuppetState) -> None:
        self._state = state
        self._ids: set[Any] | None = None

    def __contains__(self, item_id: object) -> bool:
        if self._ids is None:
            self._ids = {item.get("id") for kept in self._state.responses.values()
                         for item in (*kept["context"], *kept["output"])}
        return item_id in self._ids


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    body = await _body(request)
    state.require_model(body["model"])
    if state.failures:
        raise injected_failure(state.failures.pop(0))
    items = _context(state, body)
    instructions = body.get("instructions")
    chat = to_chat(instructions, items, state.secret) or [{"role": "user", "content": ""}]
    marks = markers(content_text(chat[-1].get("content")))
    if "fail" in marks:
        raise injected_failure(int(marks["fail"]))
    summary = request.headers.get("x-palimpsest-purpose", "").lower() == "summary"
    if summary:
        await summary_faults(state)
    model = body["model"]
    keyed = count_context(instructions, items, body.get("tools"), state.secret)
    prompt_tokens = sum(tokens for _, tokens in keyed)
    window = state.window(model)
    limit = body.get("max_output_tokens") or 0
    if prompt_tokens + limit > window:
        raise window_error(prompt_tokens, window, limit)
    cached = min(cached_prefix(state, f"responses:{model}", keyed), prompt_tokens)
    delay = state.delay(request, marks)
    if delay:
        await asyncio.sleep(delay)
    if items and item_type(items[-1]) == "compaction_trigger":
        output = [compaction_item(state, chat)]
    else:
        answer = state.next_answer(request) or decide({"messages": chat, "tools": chat_tools(body.get("tools"))}, summary)
        if answer.calls and body.get("tool_choice") == "none":  # the model may not call a tool
            answer = Answer(content="(no tool call: tool_choice none)")
        if summary and state.summary_format == "ignore":
            answer = Answer(content="\n".join(line.lstrip("#").strip()
                                              for line in (answer.content or "").splitlines()))
        output = build_output(state, answer, ENCRYPTED in (body.get("include") or ()))
    response = response_object(state, body, output, usage(prompt_tokens, cached, output, state.secret))
    if not (items and item_type(items[-1]) == "compaction_trigger"):
        planned_ending(response, answer)
    if body.get("store") is not False:
        keep(state, response, items)
    if body.get("stream"):
        return await stream_response(request, response, *stream_faults(request, marks))
    return web.Response(body=orjson.dumps(response), content_type="application/json",
                        headers=ratelimit_headers())


def compaction_item(state: PuppetState, chat: list[dict[str, Any]]) -> dict[str, Any]:
    text = render_summary(chat)
    return {"type": "compaction", "id": f"cmp_puppet{state.next_id():012d}",
            "encrypted_content": sign(state.secret, {"k": "compaction", "summary": text})}


def planned_ending(response: dict[str, Any], answer: Answer) -> None:
    """A planned answer's ending: cut by max_output_tokens or by the content filter ("incomplete",
    its last item too), and its usage as reported (zeros, or none)."""
    if answer.stop in ("length", "filter"):
        response["status"] = "incomplete"
        response["completed_at"] = None
        response["incomplete_details"] = {"reason": "max_output_tokens" if answer.stop == "length" else "content_filter"}
        if response["output"]:
            response["output"][-1]["status"] = "incomplete"
    if answer.usage == "missing":
        response["usage"] = None
    elif answer.usage == "zero":
        response["usage"] = usage(0, 0, [])
    elif answer.output_tokens is not None:
        reported = response["usage"]
        reported.update(output_tokens=answer.output_tokens, total_tokens=reported["input_tokens"] + answer.output_tokens)


def build_output(state: PuppetState, answer: Answer, encrypted: bool) -> list[dict[str, Any]]:
    if not answer.calls:
        part = ({"type": "refusal", "refusal": answer.refusal} if answer.refusal is not None else
                {"type": "output_text", "text": answer.content or "", "annotations": [], "logprobs": []})
        return [{"type": "message", "id": f"msg_puppet{state.next_id():012d}", "status": "completed",
                 "role": "assistant", "content": [part]}]
    calls = [{"type": "function_call", "id": f"fc_puppet{state.next_id():012d}",
              "call_id": f"call_{state.next_id()}", "name": name, "arguments": arguments,
              "status": "completed"} for name, arguments in answer.calls]
    said = [] if not answer.content else [  # text before the calls, as a model may write
        {"type": "message", "id": f"msg_puppet{state.next_id():012d}", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": answer.content, "annotations": [], "logprobs": []}]}]
    if not encrypted:
        return said + calls
    rs_id = f"rs_puppet{state.next_id():012d}"
    thought = answer.reasoning or "Next I call " + ", ".join(call["name"] for call in calls) + "."
    for call in calls:
        state.bound_reasoning[call["id"]] = rs_id
    reasoning = {"type": "reasoning", "id": rs_id, "summary": [], "encrypted_content": sign(
        state.secret, {"k": "reasoning", "id": rs_id, "binds": [c["id"] for c in calls],
                       "text": thought})}
    return [*said, reasoning, *calls]


def _output_tokens(item: dict[str, Any]) -> int:
    if item["type"] == "message":
        return count_text(content_text(item["content"]))
    if item["type"] == "function_call":
        return count_text(item["name"]) + count_text(item["arguments"])
    return 0


def usage(prompt_tokens: int, cached: int, output: list[dict[str, Any]],
          secret: bytes = b"") -> dict[str, Any]:
    reasoning = sum(count_text(reasoning_text(secret, item)) for item in output
                    if item["type"] == "reasoning")
    completion = sum(_output_tokens(item) for item in output) + reasoning
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt_tokens + completion}


def response_object(state: PuppetState, body: dict[str, Any], output: list[dict[str, Any]],
                    usage_: dict[str, Any]) -> dict[str, Any]:
    now = int(time.time())
    return {
        "id": f"resp_puppet{state.next_id():012d}", "object": "response", "created_at": now,
        "status": "completed", "completed_at": now, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"], "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": None, "summary": None, **(body.get("reasoning") or {})},
        "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
        "usage": usage_, "user": body.get("user"), "metadata": body.get("metadata") or {},
        "service_tier": "default",
    }


def keep(state: PuppetState, response: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """Store the response with ids on every input item, as input_items lists them."""
    context = []
    for item in items:
        if item_type(item) == "message":  # listed as the provider normalises them
            content = item["content"]
            if isinstance(content, str):
                kind = "output_text" if item["role"] == "assistant" else "input_text"
                content = [{"type": kind, "text": content}]
            item = {"type": "message", **item, "content": content}
        if not isinstance(item.get("id"), str):
            item = {"id": f"msg_puppet{state.next_id():012d}", **item}
        context.append(item)
    state.responses[response["id"]] = {"response": response, "context": context,
                                       "output": response["output"]}
    while len(state.responses) > MAX_STORED:  # oldest first: long benchmarks stay bounded
        del state.responses[next(iter(state.responses))]


def _stored(request: web.Request) -> dict[str, Any]:
    response_id = request.match_info["response_id"]
    stored = request.app[PUPPET_STATE].responses.get(response_id)
    if stored is None:
        raise PuppetError(404, f"Response with id '{response_id}' not found.",
                          type="invalid_request_error", param="response_id")
    return stored


async def get_response(request: web.Request) -> web.Response:
    await record(request, b"", None)
    return web.Response(body=orjson.dumps(_stored(request)["response"]),
                        content_type="application/json")


async def delete_response(request: web.Request) -> web.Response:
    await record(request, b"", None)
    response_id = _stored(request)["response"]["id"]
    del request.app[PUPPET_STATE].responses[response_id]
    return web.Response(body=orjson.dumps({"id": response_id, "object": "response.deleted",
                                           "deleted": True}), content_type="application/json")


async def input_items(request: web.Request) -> web.Response:
    await record(request, b"", None)
    items = list(_stored(request)["context"])
    if request.query.get("order", "desc") == "desc":
        items.reverse()
    after = request.query.get("after")
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    limit = max(1, min(100, int(request.query.get("limit", "20") or 20)))
    page = items[:limit]
    listing = {"object": "list", "data": page, "has_more": len(items) > limit,
               "first_id": page[0]["id"] if page else None,
               "last_id": page[-1]["id"] if page else None}
    return web.Response(body=orjson.dumps(listing), content_type="application/json")


async def compact(request: web.Request) -> web.Response:
    """``POST /v1/responses/compact``: the user messages kept, the rest as one compaction item."""
    state = request.app[PUPPET_STATE]
    body = await _body(request)
    state.require_model(body["model"])
    items = _context(state, body)
    chat = to_chat(body.get("instructions"), items, state.secret) or [{"role": "user", "content": ""}]
    keyed = count_context(body.get("instructions"), items, body.get("tools"), state.secret)
    prompt_tokens = sum(tokens for _, tokens in keyed)
    if prompt_tokens > state.window(body["model"]):
        raise window_error(prompt_tokens, state.window(body["model"]), 0)
    kept = [item for item in items if item_type(item) == "message" and item.get("role") == "user"]
    output = [*kept, compaction_item(state, chat)]
    compacted = {"id": f"resp_puppet{state.next_id():012d}", "object": "response.compaction",
                 "created_at": int(time.time()), "output": output,
                 "usage": usage(prompt_tokens, 0, [])}
    return web.Response(body=orjson.dumps(compacted), content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create_response)
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
