"""What of a request the ledger does not hold, kept so ``palimpsest replay`` can rebuild it
(docs/architecture.md, "Replay").

The ledger keeps a session's history, each item with the client's own wire items; a request is
that history plus what every format sends beside it: the body's other fields (model, tools,
system, instructions, sampling parameters) and the instruction items inside its list (system and
developer messages), which are not history. Each format's room says which those are
(``request_form.skeleton`` in ``gateway/chat``, ``gateway/responses``, ``gateway/messages``) as a
*skeleton*:

``{"format", "params": body without its list, "literals": [[index, element], ...],
"tail": history elements in the list, "marks": [...], ...}``

``stored`` turns a skeleton into a small document for the turn log and its *parts*: every
literal element, and every field of ``params`` longer than ``INLINE_BYTES`` of JSON, goes by its
content address (``{"$part": digest}``), so a tools list or system prompt repeated on every
request of a session is kept once for it. ``resolved`` puts the parts back. Parts are stored per
session in the turn log's file and deleted with the session (``store/turns.py``); they are
message text, so they never reach a log line.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

INLINE_BYTES = 160
PART = "$part"


def _address(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def stored(skeleton: dict[str, Any]) -> tuple[str, dict[str, bytes]]:
    """(the document, its parts by content address) of a format's skeleton."""
    parts: dict[str, bytes] = {}

    def ref(blob: bytes) -> dict[str, str]:
        digest = _address(blob)
        parts[digest] = blob
        return {PART: digest}

    params = {}
    for key, value in skeleton.get("params", {}).items():
        blob = orjson.dumps(value) if isinstance(value, (list, dict, str)) else b""
        params[key] = ref(blob) if len(blob) > INLINE_BYTES else value
    literals = [[index, ref(orjson.dumps(element))] for index, element in skeleton.get("literals", ())]
    document = {**skeleton, "params": params, "literals": literals}
    return orjson.dumps(document).decode(), parts


def resolved(document: str, parts: dict[str, bytes]) -> dict[str, Any] | None:
    """The skeleton of a stored document, its parts put back; None when one is missing."""
    try:
        skeleton = orjson.loads(document)
    except orjson.JSONDecodeError:
        return None

    def value(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {PART}:
            blob = parts.get(v[PART])
            if blob is None:
                raise LookupError(v[PART])
            return orjson.loads(blob)
        return v

    try:
        skeleton["params"] = {k: value(v) for k, v in skeleton.get("params", {}).items()}
        skeleton["literals"] = [[i, value(e)] for i, e in skeleton.get("literals", ())]
    except LookupError:
        return None
    return skeleton


def pieces(literals: list, history: list, tail: int) -> tuple[list[tuple[str, Any]], bool]:
    """The client's list rebuilt as pieces, in order: ``("literal", element)`` and ``("history",
    [items])`` runs of the path's items. A literal's index is the number of the client's own
    history items before it; the path's `tail` newest items are the client's, any older ones (a
    ``previous_response_id`` chain, an expanded compaction item) lead. False when the path is
    shorter than the client's history was (approximate: the literals keep their order)."""
    exact = len(history) >= tail
    cut = len(history) - tail if exact else 0
    client = history[cut:]
    out: list[tuple[str, Any]] = []
    run: list = list(history[:cut])
    at = 0
    for position, element in sorted(literals, key=lambda pair: pair[0]):
        if position > at:
            run.extend(client[at:position])
            at = min(position, len(client))
        if run:
            out.append(("history", run))
            run = []
        out.append(("literal", element))
    run.extend(client[at:])
    if run:
        out.append(("history", run))
    return out, exact
