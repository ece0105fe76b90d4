"""Canonical form and content addresses of chat messages.

Clients resend the whole history every turn, and SDKs and agent frameworks reshape messages on
the way back. The canonical form keeps only what changes the meaning of a message, so the same
conversation resent by any client gets the same ids, and the id of a message also covers its
parent: the path of ids is a hash chain. What each reshaping does to the identity:

- tool-call ``arguments`` (and a legacy ``function_call``'s) that parse as JSON count by their
  value: re-dumped compact with sorted keys, so ``{"a":1,"b":2}`` as the model wrote it and
  ``{"b": 2, "a": 1}`` as a framework re-serialised it are one event. Empty arguments are ``{}``.
  Arguments that do not parse (a model's broken JSON) count as the raw string.
- ``content: ""``, ``null``, ``[]`` and a missing content are the same (no text); text parts and
  the plain string they join into are the same. Other parts (images, audio) count as sent,
  without their null fields.
- whitespace in content counts: no client tested rewrites it, and a changed space in a code
  block or a prompt is an edit the ledger must keep.
- ``name`` counts where it is set (the speaker in a multi-party chat; on a tool result the
  client resends what it sent). The gateway never adds one to an answer it records.
- the order of ``tool_calls`` counts: clients resend the calls in the order the model made
  them, and the provider pairs results in that order.
- items of other wire formats arrive in the neutral model (``policies/conversation.py``): their
  opaque items (reasoning, thinking) are meaning, in their identity form (provider ids, status
  and ``cache_control`` left out); their ``wire`` copy is not.
- fields frameworks add or drop (``refusal``, ``audio``, ``annotations``, ``function_call:
  null``, ``reasoning_content``, key order) are not meaning and are left out.

Changing the canonical form changes the ids of stored events it reads differently, so such a
session forks once at its next resend of them, losing nothing (the new branch holds the whole
resent history). That happened when legacy ``function_call`` joined the form (sessions that
used legacy ``functions``) and when arguments came to count by value (tool calls whose stored
arguments were not compact sorted JSON).
"""

from __future__ import annotations

import hashlib
import json
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


def canonical_arguments(arguments: Any) -> str:
    """A tool call's arguments by value when they are JSON, else the raw string."""
    if not isinstance(arguments, str):  # a framework that sends the object itself
        arguments = orjson.dumps(arguments).decode() if arguments is not None else ""
    if not arguments.strip():
        return "{}"
    try:  # the stdlib parser keeps big integers exact, where orjson would round them to floats
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return json.dumps(value, sort_keys=True, separators=(",", ":"))  # ASCII: a lone surrogate stays an escape


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
                    "arguments": canonical_arguments((call.get("function") or {}).get("arguments")),
                },
            }
            for call in tool_calls
            if isinstance(call, dict)
        ]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    function_call = message.get("function_call")  # legacy `functions`: the call is the message
    if isinstance(function_call, dict):
        out["function_call"] = {"name": function_call.get("name"), "arguments": canonical_arguments(function_call.get("arguments"))}
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
