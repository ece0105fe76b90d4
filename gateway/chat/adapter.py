"""Chat Completions: parsing a request body into the neutral request.

The body is first checked against its declared shape (``gateway/chat/shape.py``): a 400 naming
the field on what the gateway cannot route or read. Everything the declaration leaves open,
unknown fields included, is the provider's business and is passed on unchanged.
"""

from __future__ import annotations

import orjson

from gateway.chat import shape
from gateway.pipeline.request import ChatRequest, json_object
from store.canonical import is_instruction


def parse_chat_request(raw: bytes) -> ChatRequest:
    body = json_object(raw)
    shape.STYLE.check(shape.REQUEST, body)
    return chat_request(body, raw)


def chat_request(body: dict, raw: bytes | None = None) -> ChatRequest:
    """The neutral request of a chat body, unchecked: for a client's body once it fits
    ``shape.REQUEST``, or for one the gateway builds from the ledger's neutral items (the
    inspector), which hold every format's parts as they were recorded."""
    messages = body["messages"]
    max_out = max(body.get("max_completion_tokens") or 0, body.get("max_tokens") or 0)
    instructions = [m for m in messages if is_instruction(m)]
    history = [m for m in messages if not is_instruction(m)]
    return ChatRequest(orjson.dumps(body) if raw is None else raw, body, body["model"], bool(body.get("stream")),
                       instructions, history, max_out)
