"""Canonical form and content addresses of chat messages.

Clients resend the whole history every turn, and SDKs reshape messages on the way back
(``refusal: null``, empty ``annotations``, key order, text parts vs. a plain string). The
canonical form keeps only what changes the meaning of a message, so a resent message gets the
same id, and the id of a message also covers its parent: the path of ids is a hash chain.
Items of other wire formats arrive in the neutral model (``policies/conversation.py``): their
opaque items (reasoning, thinking) are meaning too, in their identity form, and their ``wire``
copy is not. A legacy ``function_call`` is meaning (two answers calling different functions are two events);
it joined the canonical form after stores had been written, so a session that used legacy
``functions`` before then forks once at its next such message, losing nothing.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from policies.conversation import opaque_identity

INSTRUCTION_ROLES = frozenset({"system", "developer"})


def _text_of_parts(parts: list[Any]) -> str | None:
    """Text parts joined, or None when any part is not plain text (images, audio...)."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            return None
    return "".join(texts)


def _canonical_part(part: Any) -> Any:
    if isinstance(part, dict):
        return {k: _canonical_part(v) for k, v in part.items() if v is not None}
    return part


def canonical_content(content: Any) -> Any:
    if content is None or content == "":
        return None
    if isinstance(content, list):
        text = _text_of_parts(content)
        if text is not None:
            return text or None
        return [_canonical_part(p) for p in content]
    return content


def canonical_message(message: dict) -> dict:
    """The meaning-bearing subset of a message, in a stable shape."""
    out: dict[str, Any] = {"role": message.get("role")}
    content = canonical_content(message.get("content"))
    if content is not None:
        out["content"] = content
    if message.get("name"):
        out["name"] = message["name"]
    tool_calls = message.get("tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments") or "",
                },
            }
            for call in tool_calls
            if isinstance(call, dict)
        ]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    function_call = message.get("function_call")  # legacy `functions`: the call is the message
    if isinstance(function_call, dict):
        out["function_call"] = {"name": function_call.get("name"), "arguments": function_call.get("arguments") or ""}
    opaque = message.get("opaque")  # reasoning, thinking, provider items: policies/conversation.py
    if opaque:
        out["opaque"] = opaque_identity(opaque)
    return out


def event_id(parent_id: str | None, message: dict) -> str:
    """Content address: hash of the parent's id and the canonical message."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update((parent_id or "").encode())
    digest.update(b"\x00")
    digest.update(orjson.dumps(canonical_message(message), option=orjson.OPT_SORT_KEYS))
    return "ev_" + digest.hexdigest()


def path_ids(messages: list[dict]) -> list[str]:
    """Ids of a list of non-system messages, each chained to the one before."""
    ids: list[str] = []
    parent: str | None = None
    for message in messages:
        parent = event_id(parent, message)
        ids.append(parent)
    return ids


def is_instruction(message: dict) -> bool:
    return message.get("role") in INSTRUCTION_ROLES


def stored_form(message: dict) -> dict:
    """What the ledger keeps: the message without null/empty SDK noise, other fields intact."""
    out = {k: v for k, v in message.items() if v is not None and v != [] and v != {}}
    if isinstance(out.get("content"), list):
        text = _text_of_parts(out["content"])
        if text is not None:
            out["content"] = text
    return out
