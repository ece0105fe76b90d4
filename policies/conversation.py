"""The neutral conversation model every policy works on, whatever wire format a client speaks.

Clients speak Chat Completions, the Responses API or Anthropic Messages. Each wire format has an
adapter (``gateway/<format>/adapter.py``) that parses a request into this model and renders a view of it
back; the policies (rounds, the view plan, compaction, tailoring, projection, summaries, recall
schemas) see only this model. A conversation is *instructions* plus *history*, and every item of
either is a plain dict with these keys:

``role``
    ``"system"`` (instructions, and the gateway's own blocks), ``"user"``, ``"assistant"`` or
    ``"tool"``.
``content``
    Readable text: a string, ``None``, or a list of parts. Text parts are ``{"type": "text",
    "text": ...}``; any other part (an image, a document, audio) is kept as the client sent it
    and counted, never read.
``tool_calls``
    On an assistant item: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
    whatever the wire calls them (a Responses ``function_call`` or ``custom_tool_call``, an
    Anthropic ``tool_use`` block). ``arguments`` is the call's input as a string.
``tool_call_id``
    On a tool item: the call it answers. A tool item is one result (a ``function_call_output``,
    a ``tool_result`` block, a ``tool`` message).
``opaque``
    What the gateway must carry but never interpret, bound to the item it belongs to: reasoning
    items with ``encrypted_content``, thinking blocks with their ``signature``, provider
    compaction items, unknown item types. An assistant item holds the opaque items that came
    with its calls, so no round boundary, placeholder or tailoring cut can separate a reasoning
    or thinking block from the call it precedes: they are one item. Opaque items are part of the
    item's identity (``opaque_identity``), in the canonical form each adapter defines.
``wire``
    The client's own items this one came from, ``{"format": ..., "items": [...]}``. Never part
    of the identity; the adapter re-emits them unchanged when the view did not change the item,
    so opaque data reaches the provider exactly as the client sent it.

An API round is an assistant item with its calls plus the tool items answering them, wherever
the wire format puts them (``policies/rounds.py``); rounds, pairing and cuts are decided on this
model only, so they are the same for every format.
"""

from __future__ import annotations

from typing import Any

# Fields that change every time the same item is sent back (ids the provider assigns, status,
# ordering hints) and so must not fork a session. Everything else of an opaque item is identity.
VOLATILE_OPAQUE_FIELDS = frozenset({"id", "status", "index", "cache_control"})


def opaque_identity(item: Any) -> Any:
    """The part of an opaque item that says what it is: volatile fields dropped, nulls dropped,
    nested objects alike. Encrypted content and signatures are kept whole."""
    if isinstance(item, dict):
        return {k: opaque_identity(v) for k, v in item.items() if k not in VOLATILE_OPAQUE_FIELDS and v is not None}
    if isinstance(item, list):
        return [opaque_identity(v) for v in item]
    return item


def assistant_message(texts: list[str], calls: list[dict], opaque: list) -> dict:
    """The neutral assistant item of a run of model-side wire items: their texts joined, their
    calls and opaque parts (each key only when there are any)."""
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    if opaque:
        out["opaque"] = opaque
    return out


def wire_items(message: dict, fmt: str) -> list[dict] | None:
    """The client's own items behind ``message`` when they are in format ``fmt``, else None."""
    wire = message.get("wire")
    if isinstance(wire, dict) and wire.get("format") == fmt and isinstance(wire.get("items"), list):
        return wire["items"]
    return None


def with_wire(message: dict, fmt: str, items: list[dict]) -> dict:
    """``message`` carrying ``items`` as its wire form in ``fmt`` (in place; returns it)."""
    message["wire"] = {"format": fmt, "items": items}
    return message
