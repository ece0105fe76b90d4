"""The neutral request every format's adapter parses into (``ChatRequest``: instructions plus
history in the neutral conversation model, policies/conversation.py), and the JSON-body check
every format runs first (``json_object``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from gateway.http.errors import BadRequest


@dataclass(slots=True)
class ChatRequest:
    raw: bytes
    body: dict
    model: str
    stream: bool
    instructions: list[dict]  # system/developer messages: not history, always this request's
    history: list[dict]  # everything else: the path in the ledger
    max_output_tokens: int = 0
    ids: list[str] = field(default_factory=list)
    format: str = "chat"  # the wire format the client spoke (its adapter's room: chat/, responses/, messages/)
    compact: bool = False  # the client asked for the conversation to be compacted (Responses: compaction_trigger)
    added: int | None = None  # events of `history` this request added to the ledger (None: not synced)
    # What the parser saw of the list's literal elements for the request form (the format's
    # request_form.skeleton reads it rather than walking the list again), None: not kept.
    form: tuple | None = None
    # The client asks its conversation cached for the provider's long TTL (Anthropic's ttl "1h" on
    # a message's cache_control): the cost model prices the gateway's rewrites at that rate.
    long_cache: bool = False


def _too_deep(body: dict) -> bool:
    """orjson parses 1024 levels of nesting but writes only 254: a body deeper than that could
    be read but not hashed or forwarded, so it is refused as a 400 up front.
    Writing it once costs ~5 ms for 10k messages, far less than walking it in Python."""
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        return True
    return False


TOO_DEEP = "The request body is nested too deeply (JSON deeper than 254 levels)."


def json_object(raw: bytes, *, depth_checked_by_caller: bool = False) -> dict:
    """The body as a JSON object the gateway can hash and forward, else 400 (every format).
    A caller that writes the body's parts anyway checks their depth itself (`depth_checked_by_caller`:
    gateway/responses/adapter.py writes a big input list to compare it with the last one)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request ({exc.args[0]}).") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if not depth_checked_by_caller and _too_deep(body):
        raise BadRequest(TOO_DEEP)
    return body
