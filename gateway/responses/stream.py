"""Responses API streams: reading them, and the client's view of several upstream rounds as one.

A Responses stream is a sequence of typed events (``event: response.output_text.delta`` /
``data: {"type": ..., "sequence_number": n, ...}``); output items are addressed by
``output_index``. ``ResponsesEvents`` are its shapes for the one stream state machine
(``gateway/pipeline/stream_filter.py``), which turns the streams of one turn's upstream calls (the
recall loop may make several) into one stream for the client:

- ``response.created`` / ``response.in_progress`` are told once, from the first call;
- the events of a recall call item never reach the client; a reasoning item is held until the
  item after it shows whether it belongs to a client-visible item (then it is told first, so it
  stays bound to its call) or only to recall calls (then it is dropped with them);
- ``output_index`` and ``sequence_number`` are renumbered so the client sees one gapless stream;
- the final ``response.completed`` carries the first call's id, every client-visible item and
  the usage summed over all calls.
"""

from __future__ import annotations

from typing import Any

from gateway.http.sse import named_event as encode  # the named SSE event, shared with the other format
from gateway.pipeline.stream_filter import Kind, Role
from gateway.pipeline.turn import clean_usage
from gateway.responses import adapter as fmt

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})


def add_usage(total: dict | None, usage: Any) -> dict | None:
    """Responses usage summed over calls (input/output/total tokens and their details)."""
    if not isinstance(usage, dict):
        return total
    out = dict(total or {})
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = (out.get(key) or 0) + value
    for group in ("input_tokens_details", "output_tokens_details"):
        details = usage.get(group)
        if isinstance(details, dict):
            bucket = dict(out.get(group) or {})
            for key, value in details.items():
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    bucket[key] = (bucket.get(key) or 0) + value
            out[group] = bucket
    return out


def as_sent(response: dict, client_tools: Any) -> dict:
    """A response object as the client's own request would have it echoed: the API repeats the
    request's ``tools``, and the view's carried the recall tools the client never declared."""
    if "tools" in response:
        response = {**response, "tools": client_tools if isinstance(client_tools, list) else []}
    return response


def is_recall_item(item: Any, names: tuple[str, str] | None) -> bool:
    return bool(names) and isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in names


def visible_output(output: list, names: tuple[str, str] | None) -> list[dict]:
    """The output items the client may see: recall calls dropped, and a reasoning item dropped
    when no visible item follows it before the next reasoning item."""
    items = [i for i in output if isinstance(i, dict)]
    keep: list[dict] = []
    pending: dict | None = None
    for item in items:
        if item.get("type") == "reasoning":
            pending = item
            continue
        if is_recall_item(item, names):
            continue
        if pending is not None:
            keep.append(pending)
            pending = None
        keep.append(item)
    return keep


class ResponsesEvents:
    """The Responses API's event shapes for the one stream state machine
    (``gateway/pipeline/stream_filter.py``): output items addressed by ``output_index``, a
    reasoning item held (one at a time: a second one before anything visible drops the first),
    ``sequence_number`` renumbered, the response objects echoing the client's own tools."""

    index_key = "output_index"
    hold_one = True
    hidden_drops_held = False  # a reasoning item before a recall call may still bind a client call after it
    keeps_trailing_held = False  # a reasoning item no shown item follows: dropped, as visible_output drops it

    def __init__(self, names: tuple[str, str] | None, client_tools: Any = None) -> None:
        self.names = names
        self.client_tools = client_tools

    def kind(self, event: dict) -> Kind:
        kind = event.get("type")
        if kind in OPENING:
            return Kind.OPEN
        if kind in TERMINAL:
            return Kind.CLOSE
        return Kind.START if kind == "response.output_item.added" else Kind.ITEM

    def role(self, event: dict) -> Role:
        item = event.get("item") or {}
        if item.get("type") == "reasoning":
            return Role.HELD
        return Role.HIDDEN if is_recall_item(item, self.names) else Role.SHOWN

    def opening(self, event: dict) -> tuple[dict, dict | None]:
        if not isinstance(event.get("response"), dict):
            return event, None
        event = {**event, "response": as_sent(event["response"], self.client_tools)}
        return event, event["response"]

    def error(self, event: dict) -> dict | None:
        if event.get("type") != "error":
            return None
        return event.get("error") if isinstance(event.get("error"), dict) else event

    encode = staticmethod(encode)

    def closing(self, terminal: dict, first: dict | None, visible: list[dict], usage: dict | None) -> dict:
        """The client's terminal event: the first call's id, every visible item, summed usage."""
        response = as_sent(dict(terminal.get("response") or {}), self.client_tools)
        if first:
            for key in ("id", "created_at"):
                if key in first:
                    response[key] = first[key]
        response["output"] = list(visible)
        if usage is not None:
            response["usage"] = usage
        return {**terminal, "response": response}


def chat_usage(usage) -> dict | None:
    """Responses usage in the chat shape the recorder, metrics and calibration read."""
    if not isinstance(usage, dict):
        return None
    out = {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens"),
           "total_tokens": usage.get("total_tokens")}
    if isinstance(usage.get("input_tokens_details"), dict):
        out["prompt_tokens_details"] = usage["input_tokens_details"]
    if isinstance(usage.get("output_tokens_details"), dict):
        out["completion_tokens_details"] = usage["output_tokens_details"]
    return clean_usage(out)


def answer_of(response: dict, names: tuple[str, str] | None = None) -> dict | None:
    """The neutral assistant item for a completed response's output (what the client got)."""
    if not isinstance(response, dict) or response.get("status") not in (None, "completed"):
        return None
    output = response.get("output")
    if not isinstance(output, list):
        return None
    items = visible_output(output, names)
    return fmt.assistant_item(items) if items else None
