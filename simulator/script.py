"""The script: what the puppet answers, decided by the last message (see simulator.puppet)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from simulator.counting import content_text
from simulator.summary import render_summary
from simulator.validation import loads_or_none

RECALL_ANSWER_CHARS = 2_000

@dataclass
class Answer:
    content: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    # What a planned answer (PuppetState.planned) may add, each format rendering it its own way:
    # "length" (cut by the output limit: the last call's arguments may be cut too) or "filter"
    # (a content filter) instead of a natural end, "plain" for a chat answer whose calls end
    # with finish_reason "stop" (other routes: a natural end); a refusal instead of text; the model's
    # reasoning before its calls; "zero" or "missing" usage, or the output tokens it reports.
    stop: str = ""
    refusal: str | None = None
    reasoning: str | None = None
    usage: str = ""
    output_tokens: int | None = None  # the output tokens reported, in place of the count


_MARKER = re.compile(r"\[\[(fail|sleep|stall|die)\s+([\d.]+)\s*\]\]")
_CALL = re.compile(r"\[\[call\s+([\w.\-]+)\s*")
_PARALLEL = re.compile(r"\[\[parallel\s+([^\]]+)\]\]")
_RECALL = re.compile(r"RECALL:\s*(.+)", re.S)


def markers(text: str) -> dict[str, float]:
    return {kind: float(value) for kind, value in _MARKER.findall(text)}


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def offered_tool(body: dict[str, Any], fragment: str) -> str | None:
    for tool in body.get("tools") or ():
        name = (tool.get("function") or {}).get("name", "")
        if fragment in name:
            return name
    return None


def decide(body: dict[str, Any], summary: bool) -> Answer:
    messages = body["messages"]
    if summary:
        return Answer(content=render_summary(messages))
    last = messages[-1]
    if last.get("role") == "tool":
        return answer_tool_result(body, last)
    text = last_user_text(messages)
    if last.get("role") == "user":
        if call := _CALL.search(text):
            arguments, _ = _raw_json(text, call.end())
            return Answer(calls=[(call.group(1), arguments)])
        if parallel := _PARALLEL.search(text):
            return Answer(calls=[(name, "{}") for name in parallel.group(1).split()])
        if recall := _RECALL.search(text):
            question = recall.group(1).strip()
            search = offered_tool(body, "session_search")
            if search is None:
                return Answer(content=f"ANSWER: (no recall tools) {question}")
            return Answer(calls=[(search, orjson.dumps({"query": question}).decode())])
    return Answer(content=f"ok: {text[:40]}")


def _raw_json(text: str, start: int) -> tuple[str, int]:
    """The JSON object starting at text[start] (as compact JSON), else '{}'."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return "{}", start
    return orjson.dumps(value).decode(), end


def answer_tool_result(body: dict[str, Any], last: dict[str, Any]) -> Answer:
    name = _tool_name_for(body["messages"], last.get("tool_call_id"))
    text = content_text(last.get("content"))
    if "session_search" in name:
        results = (loads_or_none(text) or {}).get("results") if isinstance(loads_or_none(text), dict) else None
        if not results:
            return Answer(content="ANSWER: not found")
        if results[0].get("passage"):  # an answerable result: no load round trip
            return Answer(content=f"ANSWER: {str(results[0]['passage'])[:RECALL_ANSWER_CHARS]}")
        load = offered_tool(body, "session_load")
        if load is None:
            return Answer(content=f"ANSWER: {str(results[0].get('snippet', ''))[:RECALL_ANSWER_CHARS]}")
        return Answer(calls=[(load, orjson.dumps({"event_id": results[0].get("event_id")}).decode())])
    if "session_load" in name:
        loaded = loads_or_none(text)
        found = None
        if isinstance(loaded, dict):
            event = loaded.get("event")
            found = event.get("content") if isinstance(event, dict) else None
            found = found if found is not None else loaded.get("content")
        answer = content_text(found) if found is not None else text
        return Answer(content=f"ANSWER: {answer[:RECALL_ANSWER_CHARS]}")
    if call := _CALL.search(text):  # an agent loop: the result scripts the model's next call
        arguments, _ = _raw_json(text, call.end())
        return Answer(calls=[(call.group(1), arguments)])
    return Answer(content=f"Tool {name} returned: {text[:80]}")


def _tool_name_for(messages: list[dict[str, Any]], call_id: Any) -> str:
    for message in reversed(messages):
        for call in message.get("tool_calls") or ():
            if call.get("id") == call_id:
                return call["function"]["name"]
    return "unknown"
