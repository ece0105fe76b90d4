"""``POST /v1/messages`` and ``/v1/messages/count_tokens``, strict like Anthropic's Messages API.

The body is checked (simulator.messages_rules), turned into chat messages and answered by the
chat route's script (simulator.script.decide): with thinking on, a signed thinking block comes
before every tool_use, so a client that drops or edits it is refused on the next turn; under
``thinking.display`` "omitted" (Claude Code 2.1.332 asks it) its text is empty, the signature alone
carrying it, and a stream has no thinking_delta for it. Usage
follows Anthropic's prompt cache: a breakpoint writes the prefix up to it
(``cache_creation_input_tokens``, split by TTL in ``cache_creation``) that lives for the
breakpoint's ``ttl`` (5 minutes or 1 hour, renewed by a read), a later request reads the
longest live prefix it shares within 20 blocks before one of its breakpoints
(``cache_read_input_tokens``); ``input_tokens`` is the rest. Streams carry ``event:`` lines: message_start, ping, content_block_start / delta
(text_delta, input_json_delta, thinking_delta, signature_delta) / stop, message_delta,
message_stop.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
from aiohttp import web

from simulator.counting import content_text, count_text
from simulator.errors import PuppetError
from simulator.messages_rules import (LOOKBACK_BLOCKS, MIN_CACHEABLE, TTLS, AnthropicError, bad, blocks,
                                      block_text, thinking_on, to_chat, validate)
from simulator.script import Answer, decide, markers
from simulator.signing import thinking_signature
from simulator.state import PUPPET_STATE, PuppetState, record, summary_faults
from simulator.streaming import cut, pieces, stall, stream_faults


async def _body(request: web.Request, *, counting: bool = False) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    await record(request, raw, body)
    if body is None:
        raise bad("There was an issue with the request body: it is not valid JSON")
    validate(body, request.headers, request.app[PUPPET_STATE].secret, counting=counting)
    return body


def _failure(status: int) -> AnthropicError:
    headers = {"retry-after": "1"} if status in (429, 529) else {}
    return AnthropicError(status, headers=headers)


def _require_model(state: PuppetState, model: str) -> None:
    try:
        state.require_model(model)
    except PuppetError:  # the chat route's 404, in Anthropic's envelope
        raise AnthropicError(404, f"model: {model}") from None


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t["name"]}} for t in body.get("tools") or ()]


def cache_usage(state: PuppetState, model: str, keyed: list[tuple[bytes, int, str | None]]) -> tuple[int, int, int, int]:
    """(input, cache creation, cache read, of the creation the 1-hour part) tokens by
    Anthropic's breakpoint rules. Each breakpoint writes the prefix up to it for its TTL, and a
    read renews the entry it read. The write is split as Anthropic bills a mix of TTLs: A is the
    prefix read, B the last 1-hour breakpoint after A (else A), C the last breakpoint; B - A is
    written at the 1-hour rate, C - B at the 5-minute one."""
    written = state.cache_written.setdefault(model, {})
    now = state.clock()
    running = hashlib.sha256()
    cum = 0
    bounds: list[tuple[bytes, int, str | None]] = []
    for key, tokens, ttl in keyed:
        running.update(hashlib.sha256(key).digest())
        cum += tokens
        bounds.append((running.digest(), cum, ttl))
    marks = [i for i, (_, _, ttl) in enumerate(bounds) if ttl]
    live = [j for j in range(len(bounds)) if bounds[j][0] in written and written[bounds[j][0]][1] >= now
            and any(0 <= b - j <= LOOKBACK_BLOCKS for b in marks)]
    hit = max(live, key=lambda j: bounds[j][1], default=None)
    read = bounds[hit][1] if hit is not None else 0
    if hit is not None:
        length, _, ttl_s = written[bounds[hit][0]]
        written[bounds[hit][0]] = (length, now + ttl_s, ttl_s)
    last = bounds[marks[-1]][1] if marks else 0
    creation = last - read if last >= MIN_CACHEABLE and last > read else 0
    hour = max((bounds[i][1] for i in marks if bounds[i][2] == "1h"), default=0)
    hour = min(creation, max(0, hour - read))
    for i in marks:
        digest, length, ttl = bounds[i]
        if length >= MIN_CACHEABLE:
            ttl_s = TTLS[ttl]
            expires = max(now + ttl_s, written[digest][1] if digest in written else 0.0)
            written[digest] = (length, expires, max(ttl_s, written[digest][2] if digest in written else 0.0))
    return cum - read - creation, creation, read, hour


def build_content(state: PuppetState, answer: Answer, thinking: bool) -> list[dict[str, Any]]:
    if not answer.calls:
        text = answer.refusal if answer.refusal is not None else answer.content
        return [{"type": "text", "text": text or ""}]
    content: list[dict[str, Any]] = []
    if thinking:
        thought = answer.reasoning or "Next I call " + ", ".join(name for name, _ in answer.calls) + "."
        content.append({"type": "thinking", "thinking": thought,
                        "signature": thinking_signature(state.secret, thought)})
    if answer.content:  # text before the calls, as a model may write
        content.append({"type": "text", "text": answer.content})
    for k, (name, arguments) in enumerate(answer.calls):
        block = {"type": "tool_use", "id": f"toolu_puppet{state.next_id():012d}", "name": name,
                 "input": _input(arguments)}
        if answer.stop == "length" and k == len(answer.calls) - 1 and _input(arguments, None) is None:
            block["partial_json"] = arguments  # cut by max_tokens: streamed as far as it got
        content.append(block)
    return content


def _input(arguments: str, default: Any = ...) -> Any:
    """A call's input as the API gives it: always an object ({} for what is not one)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    return {} if default is ... else default


async def create_message(request: web.Request) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    body = await _body(request)
    _require_model(state, body["model"])
    if state.failures:
        raise _failure(state.failures.pop(0))
    chat = to_chat(body) or [{"role": "user", "content": ""}]
    marks = markers(content_text(chat[-1].get("content")))
    if "fail" in marks:
        raise _failure(int(marks["fail"]))
    summary = request.headers.get("x-palimpsest-purpose", "").lower() == "summary"
    if summary:
        try:
            await summary_faults(state)
        except PuppetError as exc:  # the chat route's injected failure, in Anthropic's envelope
            error = _failure(exc.status)
            error.headers.update(exc.headers)
            raise error from None
    keyed = blocks(body)
    prompt_tokens = sum(tokens for _, tokens, _ in keyed)
    window = state.window(body["model"])
    if prompt_tokens > window:
        raise bad(f"prompt is too long: {prompt_tokens} tokens > {window} maximum")
    fresh, creation, read, hour = cache_usage(state, body["model"], keyed)
    delay = state.delay(request, marks)
    if delay:
        await asyncio.sleep(delay)
    answer = state.next_answer(request) or decide({"messages": chat, "tools": _tools(body)}, summary)
    if answer.calls and (body.get("tool_choice") or {}).get("type") == "none":  # no tool may be called
        answer = Answer(content="(no tool call: tool_choice none)")
    if summary and state.summary_format == "ignore":
        answer = Answer(content="\n".join(line.lstrip("#").strip()
                                          for line in (answer.content or "").splitlines()))
    content = build_content(state, answer, thinking_on(body))
    output_tokens = sum(count_text(block_text(b)) for b in content)  # thinking billed even when not shown
    if (body.get("thinking") or {}).get("display") == "omitted":  # Claude Code >= 2.1.332 asks this
        content = [{**b, "thinking": "", "signature": thinking_signature(state.secret, b["thinking"], omitted=True)}
                   if b["type"] == "thinking" else b for b in content]
    usage = {"input_tokens": fresh, "cache_creation_input_tokens": creation,
             "cache_read_input_tokens": read, "output_tokens": output_tokens,
             "cache_creation": {"ephemeral_5m_input_tokens": creation - hour, "ephemeral_1h_input_tokens": hour},
             "service_tier": "standard"}
    if answer.usage:  # Anthropic always reports usage: a model that reports none reads as zeros
        usage.update(input_tokens=0, cache_creation_input_tokens=0, cache_read_input_tokens=0, output_tokens=0)
    elif answer.output_tokens is not None:
        usage["output_tokens"] = answer.output_tokens
    stop = {"length": "max_tokens", "filter": "refusal"}.get(answer.stop) or ("refusal" if answer.refusal is not None else None)
    message = {"id": f"msg_puppet{state.next_id():012d}", "type": "message", "role": "assistant",
               "model": body["model"], "content": content,
               "stop_reason": stop or ("tool_use" if answer.calls else "end_turn"), "stop_sequence": None,
               "usage": usage}
    headers = {"request-id": f"req_{message['id'][4:]}", "anthropic-organization-id": "puppet"}
    if body.get("stream"):
        return await stream_message(request, message, headers, *stream_faults(request, marks))
    whole = {**message, "content": [{k: v for k, v in b.items() if k != "partial_json"} for b in content]}
    return web.Response(body=orjson.dumps(whole), content_type="application/json", headers=headers)


async def count_tokens(request: web.Request) -> web.Response:
    state = request.app[PUPPET_STATE]
    body = await _body(request, counting=True)
    _require_model(state, body["model"])
    total = sum(tokens for _, tokens, _ in blocks(body))
    return web.Response(body=orjson.dumps({"input_tokens": total}), content_type="application/json")


def stream_events(message: dict[str, Any], chunk_chars: int) -> list[tuple[str, dict[str, Any]]]:
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 1}}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start}), ("ping", {})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            opened, deltas = {"type": "text", "text": ""}, [
                {"type": "text_delta", "text": p} for p in pieces(block["text"], chunk_chars)]
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p}
                      for p in pieces(block["thinking"], chunk_chars)]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            opened = {**{k: v for k, v in block.items() if k != "partial_json"}, "input": {}}
            raw = block.get("partial_json", orjson.dumps(block["input"]).decode())
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(raw, chunk_chars)]
        out.append(("content_block_start", {"index": index, "content_block": opened}))
        out += [("content_block_delta", {"index": index, "delta": d}) for d in deltas]
        out.append(("content_block_stop", {"index": index}))
    out.append(("message_delta", {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                  "usage": {k: usage[k] for k in (
                                      "input_tokens", "cache_creation_input_tokens",
                                      "cache_read_input_tokens", "output_tokens")}}))
    out.append(("message_stop", {}))
    return out


async def stream_message(request: web.Request, message: dict[str, Any], headers: dict[str, str],
                         stall_s: float, die_after: int = 0) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                         "Cache-Control": "no-cache",
                                         "x-simulated-provider": "palimpsest-puppet", **headers})
    await stream.prepare(request)
    try:
        for number, (name, data) in enumerate(stream_events(message, state.chunk_chars)):
            await stream.write(b"event: " + name.encode() + b"\ndata: "
                               + orjson.dumps({"type": name, **data}) + b"\n\n")
            if number + 1 == die_after:
                await cut(request)
                return stream
            if number == 0 and stall_s:
                await stall(request, stall_s)
            if state.chunk_delay_s:
                await asyncio.sleep(state.chunk_delay_s)
        await stream.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        state.disconnected.append(message["id"])
        raise
    return stream


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
