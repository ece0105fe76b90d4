"""Anthropic Messages' part of a request the ledger does not hold
(gateway/pipeline/request_form.py): the body without ``messages`` (``system`` and ``tools`` among
its fields), the ``system`` messages inside ``messages`` (and any before a provider compaction
block, which the ledger does not hold) where they stood, and where the client put its
``cache_control`` breakpoints. ``rebuild`` renders a stored path's items back between them, its
breakpoints where the client had them (a stored block keeps the marker it had when it was first
recorded, which moves on every turn)."""

from __future__ import annotations

from typing import Any

from gateway.messages.adapter import compaction_start, render_messages
from gateway.pipeline.request import ChatRequest
from gateway.pipeline.request_form import pieces

FORMAT = "messages"


def _items(message: dict) -> int:
    """How many neutral history items the adapter makes of one (non-system) message."""
    content = message.get("content")
    if message.get("role") == "assistant" or not isinstance(content, list):
        return 1
    results = sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_result")
    return results + (1 if len(content) > results or not results else 0)


def skeleton(chat: ChatRequest) -> dict[str, Any]:
    messages = chat.body.get("messages") or []
    start = compaction_start(messages)
    literals: list[list] = [[0, m] for m in messages[:start]]
    marks: list[list] = []
    seen = 0
    for i, message in enumerate(messages[start:], start):
        if message.get("role") == "system":
            literals.append([seen, message])
            continue
        seen += _items(message)
        content = message.get("content")
        if isinstance(content, list):
            marks.extend([i, j, b["cache_control"]] for j, b in enumerate(content)
                         if isinstance(b, dict) and b.get("cache_control") is not None)
    return {"format": FORMAT, "params": {k: v for k, v in chat.body.items() if k != "messages"},
            "literals": literals, "tail": seen, "marks": marks}


def _bare(message: dict) -> dict:
    """A ledger item without the system messages it carried (they are the form's literals)."""
    wire = message.get("wire")
    if isinstance(wire, dict) and "after" in wire:
        return {**message, "wire": {k: v for k, v in wire.items() if k != "after"}}
    return message


def _unmarked(message: dict) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
                                   for b in content]}


def rebuild(form: dict[str, Any], history: list[dict]) -> tuple[dict[str, Any], bool]:
    """(the request body, exact) from a stored form and the request's path in the ledger."""
    parts, exact = pieces(form.get("literals") or [], history, form.get("tail", len(history)))
    messages: list[dict] = []
    for kind, value in parts:
        if kind == "literal":
            messages.append(value)
            continue
        items = [_bare(m) for m in value]
        rendered, _ = render_messages(items, frozenset(map(id, items)))
        messages.extend(_unmarked(m) for m in rendered)
    for i, j, cache_control in form.get("marks") or ():
        content = messages[i].get("content") if i < len(messages) else None
        if isinstance(content, list) and j < len(content) and isinstance(content[j], dict):
            content[j] = {**content[j], "cache_control": cache_control}
    return {**form.get("params", {}), "messages": messages}, exact
