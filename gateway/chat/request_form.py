"""Chat Completions' part of a request the ledger does not hold (gateway/pipeline/request_form.py):
the body without ``messages``, and its system and developer messages where they stood. ``rebuild``
puts a stored path's messages back between them."""

from __future__ import annotations

from typing import Any

from gateway.pipeline.request import ChatRequest
from gateway.pipeline.request_form import pieces
from store.canonical import is_instruction

FORMAT = "chat"
# What the gateway keeps on a neutral item besides the message a chat client sends.
NOT_CHAT = ("wire", "opaque", "response_id")


def skeleton(chat: ChatRequest) -> dict[str, Any]:
    messages = chat.body.get("messages") or []
    literals, seen = [], 0
    for m in messages:
        if is_instruction(m):
            literals.append([seen, m])
        else:
            seen += 1
    return {"format": FORMAT, "params": {k: v for k, v in chat.body.items() if k != "messages"},
            "literals": literals, "tail": seen}


def chat_message(message: dict) -> dict:
    """A ledger item as a chat client sends it (an item recorded from another format loses what
    only that format carries)."""
    return {k: v for k, v in message.items() if k not in NOT_CHAT}


def rebuild(form: dict[str, Any], history: list[dict]) -> tuple[dict[str, Any], bool]:
    """(the request body, exact) from a stored form and the request's path in the ledger."""
    parts, exact = pieces(form.get("literals") or [], history, form.get("tail", len(history)))
    messages = [m for kind, value in parts for m in ([value] if kind == "literal" else map(chat_message, value))]
    return {**form.get("params", {}), "messages": messages}, exact
