"""What a client got from the gateway, read with its format's official SDK types, and what it
sends next (its answer back, as it got it, with its calls' results): for the suites that fuzz
what the model answers (tests/pipeline/test_model_behaviours.py)."""

from __future__ import annotations

import anthropic.types as at
import openai.types.chat as oc
import openai.types.responses as orr
import orjson
from anthropic.lib.streaming._messages import accumulate_event
from pydantic import TypeAdapter

from tests.pipeline.formats import events

CHUNK = TypeAdapter(oc.ChatCompletionChunk)
RESPONSE_EVENT = TypeAdapter(orr.ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(at.RawMessageStreamEvent)


def client_view(wire: str, raw: bytes, stream: bool) -> dict:
    """text, refusal, call names, output tokens (None: no usage) of one answer."""
    got = {"text": "", "refusal": "", "calls": [], "output": None}
    if wire == "chat":
        if not stream:
            data = oc.ChatCompletion.model_validate_json(raw)
            message = data.choices[0].message
            got.update(text=message.content or "", refusal=message.refusal or "",
                       calls=[c.function.name for c in message.tool_calls or ()],
                       output=data.usage.completion_tokens if data.usage else None)
            return got
        assert raw.rstrip().endswith(b"data: [DONE]"), raw[-300:]
        names: dict[int, str] = {}
        for event in events(raw):
            chunk = CHUNK.validate_python(event)
            for choice in chunk.choices:
                got["text"] += choice.delta.content or ""
                got["refusal"] += choice.delta.refusal or ""
                for call in choice.delta.tool_calls or ():
                    names[call.index] = names.get(call.index, "") + ((call.function.name if call.function else None) or "")
            if chunk.usage:
                got["output"] = (got["output"] or 0) + chunk.usage.completion_tokens
        got["calls"] = [names[k] for k in sorted(names)]
        return got
    if wire == "responses":
        if stream:
            parsed = [RESPONSE_EVENT.validate_python(e) for e in events(raw)]
            ends = [e for e in parsed if e.type in ("response.completed", "response.incomplete")]
            assert len(ends) == 1 and parsed[-1] is ends[0], [e.type for e in parsed][-5:]
            assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
            response = ends[0].response
            streamed = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
        else:
            response = orr.Response.model_validate_json(raw)
            streamed = None
        for item in response.output:
            if item.type == "message":
                for part in item.content:
                    if part.type == "output_text":
                        got["text"] += part.text
                    else:
                        got["refusal"] += part.refusal
            elif item.type == "function_call":
                got["calls"].append(item.name)
        if streamed is not None:
            assert streamed == got["text"]
        got["output"] = response.usage.output_tokens if response.usage else None
        return got
    if not stream:
        message = at.Message.model_validate_json(raw)
        blocks = message.content
        got["output"] = message.usage.output_tokens
    else:
        parsed = [MESSAGE_EVENT.validate_python(e) for e in events(raw) if e.get("type") != "ping"]
        assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
        blocks = []
        for e in parsed:
            if e.type == "content_block_start":
                assert e.index == len(blocks)
                blocks.append(e.content_block)
            elif e.type == "content_block_delta" and e.delta.type == "text_delta":
                got["text"] += e.delta.text
            elif e.type == "message_delta":
                got["output"] = e.usage.output_tokens
    for block in blocks:
        if block.type == "text" and not stream:
            got["text"] += block.text
        elif block.type == "tool_use":
            got["calls"].append(block.name)
    return got


def continued(wire: str, history: list, raw: bytes, stream: bool) -> list:
    """`history` with the answer in `raw` as the client got it and the results of its calls (a
    user message when it made none): what an agent sends next."""
    out = [*history]
    if wire == "chat":
        if stream:
            content, calls = "", {}
            for event in events(raw):
                for choice in event.get("choices") or ():
                    content += choice["delta"].get("content") or ""
                    for call in choice["delta"].get("tool_calls") or ():
                        slot = calls.setdefault(call["index"], {"id": "", "type": "function",
                                                                "function": {"name": "", "arguments": ""}})
                        slot["id"] = call.get("id") or slot["id"]
                        slot["function"]["name"] += (call.get("function") or {}).get("name") or ""
                        slot["function"]["arguments"] += (call.get("function") or {}).get("arguments") or ""
            message = {"role": "assistant", "content": content or None, "tool_calls": [calls[k] for k in sorted(calls)]}
        else:
            got = orjson.loads(raw)["choices"][0]["message"]
            message = {"role": "assistant", "content": got.get("content"), "tool_calls": got.get("tool_calls") or []}
        if not message["tool_calls"]:
            message.pop("tool_calls")
            message["content"] = message["content"] or ""
        out.append(message)
        out += [{"role": "tool", "tool_call_id": c["id"], "content": "done"} for c in message.get("tool_calls") or ()]
        if "tool_calls" not in message:
            out.append({"role": "user", "content": "go on"})
        return out
    if wire == "responses":
        response = ([e["response"] for e in events(raw) if e.get("type") == "response.completed"][-1] if stream
                    else orjson.loads(raw))
        for item in response["output"]:
            item = {k: v for k, v in item.items() if k != "status" and (k != "id" or item["type"] == "reasoning")}
            out.append(item)
            if item["type"] == "function_call":
                out.append({"type": "function_call_output", "call_id": item["call_id"], "output": "done"})
        if not any(i["type"] == "function_call" for i in response["output"]):
            out.append({"role": "user", "content": "go on"})
        return out
    if stream:
        snapshot, bufs = None, {}
        for event in events(raw):
            if event.get("type") != "ping":
                snapshot = accumulate_event(event=MESSAGE_EVENT.validate_python(event), current_snapshot=snapshot,
                                            json_bufs=bufs)
        blocks = [b.model_dump(exclude_none=True) for b in snapshot.content]
    else:
        blocks = orjson.loads(raw)["content"]
    out.append({"role": "assistant", "content": blocks})
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "done"} for b in blocks if b["type"] == "tool_use"]
    out.append({"role": "user", "content": results or "go on"})
    return out
