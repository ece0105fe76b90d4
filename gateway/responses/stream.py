"""Responses API streams: reading them, and the client's view of several upstream rounds as one.

A Responses stream is a sequence of typed events (``event: response.output_text.delta`` /
``data: {"type": ..., "sequence_number": n, ...}``); output items are addressed by
``output_index``. ``ResponseStreamFilter`` turns the streams of one turn's upstream calls (the
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

import orjson

from gateway.pipeline.turn import clean_usage
from gateway.responses import adapter as fmt

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})


def encode(event: dict) -> bytes:
    kind = event.get("type")
    head = f"event: {kind}\n".encode() if isinstance(kind, str) else b""
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


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


class ResponseStreamFilter:
    """The client's stream across the upstream calls of one turn (see the module docstring)."""

    def __init__(self, names: tuple[str, str] | None, client_tools: Any = None) -> None:
        self.names = names
        self.client_tools = client_tools  # echoed in the response objects instead of the view's tools
        self.seq = 0
        self.first: dict | None = None  # the first call's response object (id, created_at, ...)
        self.visible: list[dict] = []  # client-visible items done, in client order
        self.usage: dict | None = None
        self._next_index = 0
        self.rounds = 0
        self._round_reset()

    def _round_reset(self) -> None:
        self._map: dict[int, int] = {}  # upstream output_index -> client output_index
        self._hidden: set[int] = set()
        self._pending: int | None = None  # a reasoning item's upstream index, held
        self._held: list[dict] = []  # its events
        self._done_items: dict[int, dict] = {}

    def new_round(self) -> None:
        """The next upstream call of the turn begins (after a recall round)."""
        self.rounds += 1
        self._round_reset()

    def _out(self, event: dict) -> bytes:
        event = dict(event)
        if "sequence_number" in event:
            event["sequence_number"] = self.seq
        self.seq += 1
        if "output_index" in event and isinstance(event["output_index"], int):
            event["output_index"] = self._map.get(event["output_index"], event["output_index"])
        return encode(event)

    def _show(self, index: int) -> None:
        self._map[index] = self._next_index
        self._next_index += 1

    def _flush_pending(self) -> bytes:
        if self._pending is None:
            return b""
        index, held = self._pending, self._held
        self._pending, self._held = None, []
        self._show(index)
        if index in self._done_items:
            self.visible.append(self._done_items[index])
        return b"".join(self._out(e) for e in held)

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._hidden.add(self._pending)
        self._pending, self._held = None, []

    def feed(self, event: dict) -> bytes:
        """Bytes for the client for one upstream event (b"" when nothing is told)."""
        kind = event.get("type")
        if kind in OPENING:
            if isinstance(event.get("response"), dict):
                event = {**event, "response": as_sent(event["response"], self.client_tools)}
                if self.first is None:
                    self.first = event["response"]
            return self._out(event) if self.rounds == 0 else b""
        if kind in TERMINAL:
            return b""  # the caller decides (another round, or the end: `finish`)
        index = event.get("output_index")
        if not isinstance(index, int):
            return self._out(event)
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "reasoning":
                if self._pending is not None:
                    self._drop_pending()  # nothing visible came after it
                self._pending, self._held = index, [event]
                return b""
            if is_recall_item(item, self.names):
                self._hidden.add(index)
                return b""
            out = self._flush_pending()
            self._show(index)
            return out + self._out(event)
        if index in self._hidden:
            return b""
        if index == self._pending:
            if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
                self._done_items[index] = event["item"]
            self._held.append(event)
            return b""
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict) and index in self._map:
            self.visible.append(event["item"])
        return self._out(event)

    def end_round(self, response: dict | None, *, final: bool) -> bytes:
        """The round's terminal event arrived: its usage counts. A reasoning item still held goes
        with the recall calls of a recall round, and to the client after a final one."""
        if isinstance(response, dict):
            self.usage = add_usage(self.usage, response.get("usage"))
        if final:
            return self._flush_pending()
        self._drop_pending()
        return b""

    def finish(self, terminal: dict) -> bytes:
        """The client's terminal event: the first call's id, every visible item, summed usage."""
        response = as_sent(dict(terminal.get("response") or {}), self.client_tools)
        if self.first:
            for key in ("id", "created_at"):
                if key in self.first:
                    response[key] = self.first[key]
        response["output"] = list(self.visible)
        if self.usage is not None:
            response["usage"] = self.usage
        return self._out({**terminal, "response": response})


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
